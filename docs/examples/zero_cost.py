"""A GPT-3-sized model (175B) under DeepSpeed's ZeRO stages: chapter 17 runs this.

    python docs/examples/zero_cost.py        # rank 0 at ZeRO 0-3, beside DeepSpeed's formulas

tp 8 inside a node and dp 128 across 1024 ranks (the engine runs no pipeline), bf16, full
recomputation of every layer (activations would not fit otherwise), global batch 1536. Every
figure of ours is minitron's estimator on the validated flags (training/theoretical_zero.py),
the path `minitron estimate --deepspeed` takes; DeepSpeed's are its
estimate_zero2_model_states_mem_needs / estimate_zero3_model_states_mem_needs without offload,
for the parameters a tensor-parallel rank holds, over the data-parallel ranks.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from minitron.cli.common import validate_pretrain
from minitron.cli.views.words import human
from minitron.training import theoretical_memory_usage as tmu
from minitron.training.theoretical_params import model_params
from minitron.training.theoretical_zero import largest_module
from minitron.training.tokenizer import build_tokenizer

WORLD, TP, BATCH = 1024, 8, 1536
GPT3 = ["--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96", "--seq-length", "2048",
        "--micro-batch-size", "1", "--global-batch-size", str(BATCH), "--vocab-size", "50256", "--bf16",
        "--attention-dropout", "0", "--tensor-model-parallel-size", str(TP), "--recompute-granularity", "full",
        "--recompute-method", "uniform", "--recompute-num-layers", "1", "--train-iters", "1", "--lr", "1e-4", "--mock-data"]


def costs(stage: int, world: int = WORLD):
    """The validated args and rank 0's estimate at ZeRO ``stage``."""
    config = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": stage}}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"ds_zero{stage}.json"
        path.write_text(json.dumps(config))
        args = validate_pretrain(GPT3 + ["--deepspeed", "--deepspeed-config", str(path)], world)
        build_tokenizer(args)
        return args, tmu.report_theoretical_memory(args)[0]


def deepspeed(stage: int, params: int, largest: int, gpus: int) -> int | None:
    """DeepSpeed's GPU bytes for the model states, no offload: 2P + 18P/N (ZeRO-2),
    4 x largest layer + 18P/N (ZeRO-3); it has no formula for stages 0 and 1."""
    if stage == 2:
        return 2 * params + int(18 * params / gpus)
    if stage == 3:
        return 4 * largest + int(18 * params / gpus)
    return None


def table() -> None:
    args, _ = costs(0)
    dp = args.data_parallel_size
    print(f"GPT-3 175B, {WORLD} ranks: tp {TP} x dp {dp}, bf16, full recomputation; rank 0 of each")
    print(f"{'ZeRO':<5} {'weights':>10} {'grads':>10} {'optimizer':>10} {'states':>10} {'DeepSpeed':>10}"
          f" {'activ.':>10} {'dp bytes':>10}")
    for stage in (0, 1, 2, 3):
        args, rank = costs(stage)
        m = rank.memory
        states = m["params"] + m["grads"] + m["optimizer"]
        theirs = deepspeed(stage, rank.params, largest_module(model_params(args, 0, 0)), dp)
        print(f"{stage:<5} {human(m['params']):>10} {human(m['grads']):>10} {human(m['optimizer']):>10} "
              f"{human(states):>10} {human(theirs) if theirs else '-':>10} {human(m['activations']):>10} "
              f"{human(rank.comm['dp']):>10}")
    (_, two, per, _), (_, three, _, largest) = differences()
    print(f"DeepSpeed - ours, ZeRO-2: {human(two)} = 4 x P/N ({human(4 * per)}): an fp32 gradient partition")
    print(f"DeepSpeed - ours, ZeRO-3: {human(three)} = 4 x largest layer ({human(4 * largest)}) + 2 x P/N "
          f"({human(2 * per)})")


def differences() -> list[tuple[int, int, int, int]]:
    """(stage, DeepSpeed's bytes - ours, P/N, largest module) for stages 2 and 3, rank 0."""
    out = []
    for stage in (2, 3):
        args, rank = costs(stage)
        largest = largest_module(model_params(args, 0, 0))
        ours = rank.memory["params"] + rank.memory["grads"] + rank.memory["optimizer"]
        out.append((stage, deepspeed(stage, rank.params, largest, args.data_parallel_size) - ours,
                    rank.params // args.data_parallel_size, largest))
    return out


if __name__ == "__main__":
    table()
