"""Which data-parallel rank owns which slice of the gradient buffer under ZeRO-1.

    python scripts/show_zero_shards.py                          # dp=4, one bucket
    python scripts/show_zero_shards.py --dp 2 --bucket-size 300 # dp=2, buckets of >= 300

Runs a small MLP on forked gloo ranks with DistributedDataParallel(use_distributed_optimizer)
and the DistributedOptimizer, takes two training steps with tracing on, and prints what the
ranks report: the buffer layout, each rank's shard, the Adam state each rank holds, and the
collectives of the second step on rank 0 (with buckets, the first step only learns when each
bucket is complete).
"""

from __future__ import annotations

import argparse
import re
import os
import string
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

STEP = "zero1.train_step"


def rank_main(bucket_size: int | None) -> dict:
    """On one of the dp ranks: one traced ZeRO-1 step; what this rank's buffer and optimizer hold."""
    import torch

    from minitron.core import parallel_state
    from minitron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from minitron.core.distributed.finalize_model_grads import finalize_model_grads
    from minitron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from minitron.trace import traced

    parallel_state.initialize_model_parallel(1)
    try:
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(OrderedDict(fc1=torch.nn.Linear(8, 32), norm=torch.nn.LayerNorm(32),
                                              act=torch.nn.GELU(), fc2=torch.nn.Linear(32, 8)))
        ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True,
                                                   overlap_grad_reduce=bucket_size is not None,
                                                   bucket_size=bucket_size)
        # DDP reads two fields of the model's TransformerConfig; a stand-in does for an MLP.
        model_config = SimpleNamespace(sequence_parallel=False, calculate_per_token_loss=False)
        model = DistributedDataParallel(model_config, ddp_config, mlp)
        optimizer = get_megatron_optimizer(OptimizerConfig(lr=1e-3, use_distributed_optimizer=True), [model])
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(parallel_state.get_data_parallel_rank()))

        @traced(name="zero1.backward")
        def backward(loss):
            loss.backward()

        @traced(name=STEP)
        def train_step():
            model.zero_grad_buffer()
            optimizer.zero_grad()
            backward(model(x).pow(2).mean())
            finalize_model_grads([model])
            return optimizer.step()

        # Two steps: with overlap, the first only learns which gradients each bucket waits
        # for and reduces after backward; the second launches each bucket from backward.
        train_step()
        train_step()
        buffer = model.buffers[0]
        names = {p: n for n, p in mlp.named_parameters()}
        return {
            "numel": buffer.numel, "numel_unpadded": buffer.numel_unpadded,
            "buckets": buffer.bucket_indices,
            "params": [(names[p], *buffer.param_index_map[p][:2]) for p in reversed(buffer.params)],
            "owned": {names[p]: r for p, r in optimizer.param_range_map.items()},
            "state": sum(s["exp_avg"].numel() + s["exp_avg_sq"].numel() for s in optimizer.state.values()),
        }
    finally:
        parallel_state.destroy_model_parallel()


def draw(report: dict, dp: int, width: int = 64) -> list[str]:
    """Three rows of one character per `scale` elements: parameters, owning rank, bucket."""
    numel = report["numel"]
    scale = -(-numel // width)
    letters = {name: string.ascii_lowercase[i] for i, (name, _, _) in enumerate(report["params"])}
    owner_of, bucket_of = [], []
    for b, (start, end) in enumerate(report["buckets"]):
        shard = (end - start) // dp
        owner_of += [(i - start) // shard for i in range(start, end)]
        bucket_of += [b] * (end - start)
    param_of = ["."] * numel
    for name, start, end in report["params"]:
        param_of[start:end] = letters[name] * (end - start)

    def row(values) -> str:
        # Each character shows the value most of its elements have.
        cells = [values[i:i + scale] for i in range(0, numel, scale)]
        return "".join(str(max(set(c), key=c.count)) for c in cells)

    lines = [f"one character = {scale} elements of the flat buffer; '.' is alignment padding",
             f"  params  {row(param_of)}", f"  owner   {row(owner_of)}"]
    if len(report["buckets"]) > 1:
        lines.append(f"  bucket  {row(bucket_of)}")
    lines.append("")
    lines += [f"  {letters[n]} = {n:<12} buffer [{s}, {e})" for n, s, e in report["params"]]
    return lines


def tree(records: list[dict]) -> list[str]:
    children: dict = {}
    for r in records:
        children.setdefault(r["parent"], []).append(r)
    root = [r for r in records if r["name"] == STEP][-1]   # the last step: overlap at work

    def label(r: dict) -> str:
        a = r["args"]
        if r["name"].startswith("torch.distributed."):
            return f"{r['name'][len('torch.distributed.'):]}  {a.get('group')} {a.get('ranks')} {a.get('shape', '')}"
        # module.Class.method -> Class.method; module.function -> function
        parts = r["name"].split(".")
        short = ".".join(parts[-2:]) if re.match(r"_?[A-Z]", parts[-2]) else parts[-1]
        shown = {k: v for k, v in a.items() if isinstance(v, (str, int, float, bool))}
        return short + ("  " + " ".join(f"{k}={v}" for k, v in shown.items()) if shown else "")

    lines = [label(root)]

    def walk(node: dict, prefix: str) -> None:
        kids = children.get(node["id"], [])
        for i, kid in enumerate(kids):
            last = i == len(kids) - 1
            lines.append(prefix + ("└── " if last else "├── ") + label(kid))
            walk(kid, prefix + ("    " if last else "│   "))

    walk(root, "")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, default=4, help="data-parallel size (= number of ranks)")
    parser.add_argument("--bucket-size", type=int, default=None,
                        help="elements per bucket (turns on overlap_grad_reduce); default: one bucket")
    args = parser.parse_args(argv)
    if not 1 <= args.dp <= 8 or (args.bucket_size is not None and args.bucket_size < 1):
        parser.error("need 1 <= --dp <= 8 and a positive --bucket-size")

    from minitron.launcher import LaunchConfig, RankFailure, run_on_ranks, session_env
    from minitron.trace.reader import load_trace

    with tempfile.TemporaryDirectory() as tmp:
        trace_dir = Path(tmp) / "trace"
        config = LaunchConfig(world_size=args.dp, env=session_env(args.dp, trace_dir))  # warms torch._dynamo
        try:
            reports = run_on_ranks(lambda rank: rank_main(args.bucket_size), config)
        except RankFailure as failure:
            print(f"{failure}\n{failure.log_tail()}", file=sys.stderr)
            return 1
        records = load_trace(trace_dir)[0]

    first = reports[0]

    print(f"ZeRO-1 over {args.dp} data-parallel ranks; an MLP fc1 -> norm -> fc2; "
          f"{len(first['buckets'])} bucket(s); buffer {first['numel']} elements "
          f"({first['numel'] - sum(e - s for _, s, e in first['params'])} of them padding)\n")
    print("\n".join(draw(first, args.dp)))
    print("\nwhat each rank steps (slices of param.view(-1)) and the Adam moments it keeps:")
    for rank, rep in enumerate(reports):
        owned = ", ".join(f"{name}[{s}:{e}]" for name, (s, e) in sorted(
            rep["owned"].items(), key=lambda kv: [n for n, _, _ in first["params"]].index(kv[0])))
        print(f"  rank {rank}: {owned}")
        print(f"          Adam state {rep['state']} numbers (2 x {rep['state'] // 2})")
    held = sum(r["state"] for r in reports)
    print(f"  together: {held} = 2 x {held // 2} (every parameter once); "
          f"without ZeRO-1 each rank would hold 2 x {sum(e - s for _, s, e in first['params'])}")
    print("\nthe second training step on rank 0 (traced):")
    print("\n".join(tree(records)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
