"""Measure the activation bytes one transformer layer keeps for backward, with and without recomputation.

    python scripts/measure_activations.py
    python scripts/measure_activations.py --seq-length 512 --hidden-size 256 --num-attention-heads 16

Every tensor autograd saves for backward passes through a ``saved_tensors_hooks`` pack hook;
the hook records each tensor's storage (a tensor saved twice, or two views of one buffer, count
once) and leaves out the parameters, which exist whether or not anything is saved. A block of
``--num-layers`` layers runs forward in training mode (dropout on) on forked gloo ranks, for three
layouts (tp 1, tp 2, tp 2 with sequence parallelism) and three settings (no recomputation,
selective, full); the table gives the bytes per layer on one rank, next to two formulas:

* minitron's, derived from what its fp32 CPU layer saves (see walkthrough chapter 8c), which the
  measurement must match to the byte, or this script fails;
* the one of "Reducing Activation Recomputation in Large Transformer Models" (Korthikanti et
  al., 2022) for a 16-bit model with 1-byte dropout masks: sbh(34 + 5as/h), divided as the paper
  divides it across tensor-parallel ranks.
"""

from __future__ import annotations

import argparse
import sys

MODES = {"none": {}, "selective": {"recompute_granularity": "selective"},
         "full": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}}
LAYOUTS = [(1, False), (2, False), (2, True)]   # (tp, sequence parallel)


def measure(args, tp: int, sp: bool) -> dict[str, int]:
    """On one rank: saved bytes per layer for each recompute mode."""
    import torch

    from minitron.core.saved_tensors import SavedTensors
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.core.transformer import TransformerConfig
    from minitron.core.transformer.transformer_block import TransformerBlock

    per_layer = {}
    for mode, recompute in MODES.items():
        config = TransformerConfig(num_layers=args.num_layers, hidden_size=args.hidden_size,
                                   num_attention_heads=args.num_attention_heads, tensor_model_parallel_size=tp,
                                   sequence_parallel=sp, init_seed=1, **recompute)
        model_parallel_cuda_manual_seed(1)
        block = TransformerBlock(config, pre_process=True, post_process=False)   # layers only
        s = args.seq_length // tp if sp else args.seq_length
        x = torch.randn(s, args.micro_batch_size, args.hidden_size, requires_grad=True)
        with SavedTensors(exclude=block.parameters()) as saved:
            out = block(x)
        out.sum().backward()   # recomputation really happens (and saves nothing the hook sees)
        per_layer[mode] = saved.nbytes // args.num_layers
    return per_layer


def minitron_formula(s: int, b: int, h: int, a: int, t: int, sp: bool) -> dict[str, int]:
    """What minitron's fp32 layer saves, in bytes: 4 per element, dropout masks included."""
    sbh, sb, as2b = s * b * h, s * b, a * s * s * b
    shard = t if sp else 1                       # sequence parallelism splits the replicated part
    # Replicated (or sequence-split): two norm inputs, two dropout masks, and the inputs of
    # linear_qkv and linear_fc1: with sequence parallelism those linears keep only this rank's
    # rows and gather them again in backward. Split by heads / ffn: q, k, v, the context, GeLU's
    # input and output.
    elements = (6 * sbh) // shard + (3 + 1 + 4 + 4) * sbh // t
    norm_stats = 2 * 2 * sb // shard             # mean and 1/std of each norm, per token
    core = 3 * as2b // t                         # softmax output, dropout mask, dropout output
    mask = s * s                                 # the causal mask, bool, made per layer
    return {"none": 4 * (elements + norm_stats + core) + mask,
            "selective": 4 * (elements + norm_stats),   # q, k, v stay (as views of linear_qkv's output)
            "full": 4 * sbh // shard}            # the layer's input only


def paper_formula(s: int, b: int, h: int, a: int, t: int, sp: bool) -> dict[str, float]:
    """Korthikanti et al. 2022, Table 2: 16-bit activations, 1-byte masks, bytes per layer."""
    sbh = s * b * h
    if sp:
        none, selective = sbh * (34 + 5 * a * s / h) / t, sbh * 34 / t
    else:
        none, selective = sbh * (10 + 24 / t + 5 * a * s / (h * t)), sbh * (10 + 24 / t)
    return {"none": none, "selective": selective, "full": 2 * sbh}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-attention-heads", type=int, default=8)
    parser.add_argument("--num-layers", type=int, default=2)
    args = parser.parse_args(argv)
    s, b, h, a = args.seq_length, args.micro_batch_size, args.hidden_size, args.num_attention_heads
    if h % a or a % 2 or s % 2 or min(s, b, h, a, args.num_layers) < 1:
        parser.error("need positive sizes, --num-attention-heads even and dividing --hidden-size, --seq-length even")

    from minitron.core import parallel_state
    from minitron.launcher import LaunchConfig, RankFailure, run_on_ranks

    print(f"one layer of a {args.num_layers}-layer block, fp32 on CPU, dropout on: "
          f"s={s} b={b} h={h} a={a} (5as/h = {5 * a * s / h:g})")
    print(f"{'layout':<10} {'recompute':<10} {'measured':>12} {'minitron':>12} {'paper 16-bit':>13} {'ratio':>6}")
    bad = []
    for tp, sp in LAYOUTS:
        def rank_main(rank: int, tp=tp, sp=sp) -> dict:
            parallel_state.initialize_model_parallel(tp)
            return measure(args, tp, sp)
        try:
            measured = run_on_ranks(rank_main, LaunchConfig(world_size=tp, warm=()))[0]
        except RankFailure as failure:
            print(f"{failure}\n{failure.log_tail()}", file=sys.stderr)
            return 1
        ours, paper = minitron_formula(s, b, h, a, tp, sp), paper_formula(s, b, h, a, tp, sp)
        layout = f"tp {tp}" + (" + sp" if sp else "")
        for mode in MODES:
            print(f"{layout:<10} {mode:<10} {measured[mode]:>12,} {ours[mode]:>12,} {round(paper[mode]):>13,} "
                  f"{measured[mode] / paper[mode]:>6.2f}")
            if measured[mode] != ours[mode]:
                bad.append(f"{layout} {mode}: measured {measured[mode]:,} B, formula {ours[mode]:,} B")
    print("bytes per layer on one rank; ratio = measured / paper")
    if bad:
        print("the measurement no longer matches minitron's formula (update it and chapter 8c):", file=sys.stderr)
        print("\n".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
