"""Trace one ColumnParallelLinear -> GeLU -> RowParallelLinear pair on forked gloo ranks.

    python scripts/tp_pair_trace.py                      # tp=2: one all-reduce each way
    python scripts/tp_pair_trace.py --sequence-parallel  # all-gather / reduce-scatter instead
    python scripts/tp_pair_trace.py --gpt                # a whole one-layer GPTModel instead
    python scripts/tp_pair_trace.py --saved --seq 2048 --hidden 1024   # what sequence parallelism's
                                                         # column linear keeps, and its all-gathers

Each rank runs forward and backward once with tracing on; the script then prints rank 0's
calls as a tree: every step with the shapes it saw, every collective with its group.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

STEP = "tp_pair.forward_backward"
GPT_STEP = "gpt.forward_backward"


def tp_config(hidden: int, sequence_parallel: bool, **extra):
    """On a rank with the TP groups set up: a one-layer config for its tp size, with the
    model-parallel random generators seeded, as every step below starts."""
    from minitron.core import parallel_state
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.core.transformer import TransformerConfig

    tp = parallel_state.get_tensor_model_parallel_world_size()
    config = TransformerConfig(num_layers=1, hidden_size=hidden, num_attention_heads=tp,
                               tensor_model_parallel_size=tp, sequence_parallel=sequence_parallel, **extra)
    model_parallel_cuda_manual_seed(1234)
    return config


def pair_step(seq: int = 4, batch: int = 2, hidden: int = 8, sequence_parallel: bool = False) -> None:
    """On a rank with the TP groups set up: build the pair, run forward and backward once."""
    import torch
    import torch.nn.functional as F

    from minitron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from minitron.trace import traced

    config = tp_config(hidden, sequence_parallel)
    tp = config.tensor_model_parallel_size
    column = ColumnParallelLinear(hidden, 4 * hidden, config=config, init_method=config.init_method)
    row = RowParallelLinear(4 * hidden, hidden, config=config, init_method=config.init_method,
                            input_is_parallel=True)
    # Without sequence parallelism every rank holds the whole input; with it, its part of it.
    local_seq = seq // tp if config.sequence_parallel else seq
    x = torch.randn(local_seq, batch, hidden, generator=torch.Generator().manual_seed(0), requires_grad=True)

    @traced(name="tp_pair.forward")
    def forward(x):
        h, _ = column(x)
        y, _ = row(F.gelu(h))
        return y.pow(2).mean()

    @traced(name="tp_pair.backward")
    def backward(loss):
        loss.backward()

    @traced(name=STEP)
    def forward_backward(x):
        backward(forward(x))

    forward_backward(x)


def gpt_step(seq: int = 4, batch: int = 2, hidden: int = 8, sequence_parallel: bool = False) -> None:
    """On a rank with the TP groups set up: one forward and backward of a one-layer GPTModel."""
    import torch

    from minitron.core.models.gpt import GPTModel
    from minitron.training.tokenizer import _vocab_size_with_padding
    from minitron.trace import traced

    config = tp_config(hidden, sequence_parallel, hidden_dropout=0.0, attention_dropout=0.0)
    vocab = _vocab_size_with_padding(10, 4, config.tensor_model_parallel_size)
    model = GPTModel(config, vocab, seq, share_embeddings_and_output_weights=True)
    ids = torch.randint(0, 10, (batch, seq), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(seq).expand(batch, seq)

    @traced(name="gpt.backward")
    def backward(loss):
        loss.backward()

    @traced(name=GPT_STEP)
    def forward_backward():
        backward(model(ids, positions, labels=ids).mean())

    forward_backward()


def saved_bytes(seq: int, batch: int, hidden: int) -> dict:
    """On a rank with the TP groups set up: the bytes autograd keeps, and the all-gathers run, in
    one forward and backward of a sequence-parallel ColumnParallelLinear h -> 4h, two ways: as
    the layer does it (keep my rows, gather them again in backward), and gathered once by the
    mapping and kept whole."""
    import torch
    import torch.nn.functional as F

    from minitron.core.saved_tensors import SavedTensors
    from minitron.core.tensor_parallel import ColumnParallelLinear, gather_from_sequence_parallel_region

    config = tp_config(hidden, sequence_parallel=True)
    tp = config.tensor_model_parallel_size
    column = ColumnParallelLinear(hidden, 4 * hidden, config=config, init_method=config.init_method)
    gather = torch.distributed.all_gather_into_tensor

    def run(layer) -> tuple[int, int]:
        kept, gathers = SavedTensors(exclude=column.parameters()), []

        def counted(*args, **kwargs):
            gathers.append(1)
            return gather(*args, **kwargs)

        x = torch.randn(seq // tp, batch, hidden, requires_grad=True)   # my rows of the sequence
        torch.distributed.all_gather_into_tensor = counted
        try:
            with kept:
                y = layer(x)
            y.sum().backward()
        finally:
            torch.distributed.all_gather_into_tensor = gather
        return kept.nbytes, len(gathers)

    regather = run(lambda x: column(x)[0])
    whole = run(lambda x: F.linear(gather_from_sequence_parallel_region(x), column.weight, column.bias))
    return {"regather": regather, "whole": whole}


def load_records(trace_dir: Path, rank: int) -> list[dict]:
    lines = (Path(trace_dir) / f"rank{rank}.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines if line.strip()), key=lambda r: (r["start_us"], r["id"]))


def _label(record: dict) -> str:
    name, args = record["name"], record["args"]
    if name.startswith("torch.distributed."):
        shape = args.get("shape")
        return (f"{name.removeprefix('torch.distributed.')}  {args.get('group')} {args.get('ranks')}"
                f"  shape {shape} {args.get('dtype', '')}".rstrip() + ("  async" if args.get("async_op") else ""))
    short = name.split(".")[-1] if not name.endswith(("forward", "backward")) else ".".join(name.split(".")[-2:])
    if name.startswith("tp_pair."):
        short = name
    shapes = []
    for key, value in args.items():
        if isinstance(value, dict) and "tensor" in value:
            shapes.append(f"{key} {value['tensor']}")
    return f"{short}  " + "  ".join(shapes) if shapes else short


def render_tree(records: list[dict], root_name: str = STEP) -> str:
    """The subtree under the first call named ``root_name``, drawn with box characters."""
    children: dict[int | None, list[dict]] = {}
    for r in records:
        children.setdefault(r["parent"], []).append(r)
    root = next(r for r in records if r["name"] == root_name)
    lines = [_label(root)]

    def walk(node: dict, prefix: str) -> None:
        kids = children.get(node["id"], [])
        for i, kid in enumerate(kids):
            last = i == len(kids) - 1
            lines.append(prefix + ("└── " if last else "├── ") + _label(kid))
            walk(kid, prefix + ("    " if last else "│   "))

    walk(root, "")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size (= number of ranks)")
    parser.add_argument("--seq", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=8)
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--gpt", action="store_true", help="trace a one-layer GPTModel, not the pair")
    parser.add_argument("--saved", action="store_true", help="the bytes a sequence-parallel column linear "
                        "keeps for backward, kept as its rows or gathered and whole")
    parser.add_argument("--keep", type=Path, help="trace into this directory and keep it (for "
                        "python -m minitron.cli.views.svg_shapes)")
    args = parser.parse_args(argv)
    if args.tp < (1 if args.gpt else 2) or args.hidden % args.tp or (args.sequence_parallel and args.seq % args.tp):
        parser.error("need --tp >= 2 (>= 1 with --gpt) dividing --hidden (and --seq, with --sequence-parallel)")
    if args.saved and (args.gpt or args.keep or args.seq % args.tp):
        parser.error("--saved measures one column linear: no --gpt or --keep, and --tp must divide --seq")

    from minitron.core import parallel_state
    from minitron.launcher import LaunchConfig, RankFailure, run_on_ranks, session_env

    def rank_main(rank: int):
        parallel_state.initialize_model_parallel(args.tp)
        if args.saved:
            return saved_bytes(args.seq, args.batch, args.hidden)
        step = gpt_step if args.gpt else pair_step
        step(args.seq, args.batch, args.hidden, args.sequence_parallel)

    if args.saved:
        return _print_saved(args, run_on_ranks(rank_main, LaunchConfig(world_size=args.tp, warm=()))[0])

    with tempfile.TemporaryDirectory() as tmp:
        trace_dir = args.keep or Path(tmp) / "trace"
        config = LaunchConfig(world_size=args.tp, env=session_env(args.tp, trace_dir), warm=())
        try:
            run_on_ranks(rank_main, config)
        except RankFailure as failure:
            print(f"{failure}\n{failure.log_tail()}", file=sys.stderr)
            return 1
        local = args.seq // args.tp if args.sequence_parallel else args.seq
        if args.gpt:
            print(f"rank 0 of {args.tp}; GPTModel, 1 layer, hidden {args.hidden}, input_ids [b={args.batch},"
                  f" s={args.seq}]{', sequence parallel' if args.sequence_parallel else ''}")
        else:
            print(f"rank 0 of {args.tp}; input x [s={local}, b={args.batch}, h={args.hidden}]"
                  f"{' (its part of the sequence)' if args.sequence_parallel else ''}; "
                  f"Column h -> 4h, Row 4h -> h")
        print(render_tree(load_records(trace_dir, 0), GPT_STEP if args.gpt else STEP))
    return 0


def _print_saved(args, result: dict) -> int:
    s, b, h, t = args.seq, args.batch, args.hidden, args.tp
    (kept, gathers), (whole, once) = result["regather"], result["whole"]
    print(f"rank 0 of {t}; ColumnParallelLinear h -> 4h with sequence parallelism, fp32; "
          f"s={s} b={b} h={h} t={t}")
    print(f"{'the input kept for backward':<40} {'bytes':>12} {'all-gathers':>12}")
    print(f"{'its rows, gathered again (Megatron)':<40} {kept:>12,} {gathers:>12}")
    print(f"{'the gathered whole':<40} {whole:>12,} {once:>12}")
    print(f"saved: {whole - kept:,} bytes = s*b*h*(t-1)/t * 4 = {s * b * h * (t - 1) // t * 4:,}; "
          f"the extra all-gather hands {s * b * h // t * 4:,} bytes (s*b*h/t * 4)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
