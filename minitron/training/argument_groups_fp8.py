"""Megatron's fp8 flags (Megatron 0.19.2 generates them from TransformerConfig's fp8 fields:
same names, defaults and choices; ``--fp8-format`` sets ``args.fp8``). What they mean and what
must hold between them and the others: training/arguments_fp8.py. Nothing here imports torch.
"""

from __future__ import annotations

from minitron.training.arguments_ranges import int_in


def add_fp8_args(g) -> None:
    """Into Megatron's group for them (here: mixed precision)."""
    g.add_argument("--fp8-format", dest="fp8", choices=["e4m3", "hybrid"], default=None,
                   help="fp8 GEMM inputs in the transformer layers: e4m3 everywhere, or hybrid "
                        "(e4m3 forward, e5m2 for gradients)")
    g.add_argument("--fp8-recipe", choices=["tensorwise", "delayed", "mxfp8", "blockwise", "custom"],
                   default="delayed", help="how scales are chosen: delayed (from an amax history) or "
                                           "tensorwise (from each tensor as it is cast)")
    g.add_argument("--fp8-margin", type=int_in(0, 64, "2^64 would leave fp8 nothing of the range"), default=0,
                   help="delayed: scale = fp8_max / amax / 2^margin")
    g.add_argument("--fp8-amax-history-len", type=int_in(1, 1 << 20, "a longer history is never read"),
                   default=1, help="delayed: how many steps' amaxes the scale is chosen from")
    g.add_argument("--fp8-amax-compute-algo", choices=["most_recent", "max"], default="most_recent",
                   help="delayed: the history's newest amax, or its largest")
    g.add_argument("--fp8-param-gather", action="store_true",
                   help="keep the fp8 linears' weights in fp8 and all-gather them in fp8 from the "
                        "distributed optimizer (one byte per element instead of two)")
