"""torch's FSDP2 behind --use-torch-fsdp2, traced: chapter 12 runs this.

    python docs/examples/torch_fsdp2_run.py

One traced `pretrain` on 2 forked gloo ranks (a 2-layer GPT of hidden size 64, 2 micro-batches
per rank, 1 iteration: FSDP2's first step makes the same calls as the ones after it). It prints each FSDP2 unit with rank 0's shard (what its all-gather
hands in), then every collective rank 0 called over the data-parallel group in the first
micro-batch of the last step, in order, each named by the unit its shape belongs to, and whether
forward or backward called it; last, rank 0's bytes as `minitron estimate` predicts them
(tests/test_torch_fsdp2.py checks them against what a run holds) and the last loss.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from minitron.cli.common import validate_pretrain
from minitron.launcher import LaunchConfig, Target, launch, session_env
from minitron.trace.reader import TRAIN_STEP, load_trace
from minitron.training import theoretical_memory_usage as tmu
from minitron.training.theoretical_torch_fsdp2 import unit_shards
from minitron.training.tokenizer import build_tokenizer

OUT = Path("docs-out/torch_fsdp2")
MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "1", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023", "--distributed-backend", "gloo",
         "--untie-embeddings-and-output-weights", "--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]
DIST = "torch.distributed."


def _in_backward(record, by_id) -> bool:
    while record.get("parent") in by_id:
        record = by_id[record["parent"]]
        if record["name"].endswith("backward_step"):
            return True
    return False


def main() -> None:
    args = validate_pretrain(MODEL, 2)
    build_tokenizer(args)
    shards = unit_shards(args)
    print(f"{'unit':<18} {'shard (elements)':>16}")
    for name, n in shards.items():
        print(f"{name:<18} {n:>16,}")

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "it.jsonl").unlink(missing_ok=True)
    import torch.distributed.fsdp  # noqa: F401  (loaded once here, 0.7 s, not once in each forked rank)
    launch(LaunchConfig(world_size=2, log_dir=OUT / "logs", env=session_env(2, OUT / "trace")),
           Target(module="minitron.pretrain_gpt", argv=[*MODEL, "--log-jsonl", str(OUT / "it.jsonl")]))
    records = load_trace(OUT / "trace")[0]
    by_id = {r["id"]: r for r in records}
    last = [r for r in records if r["name"] == TRAIN_STEP][-1]
    calls = [r for r in records if last["start_us"] <= r["start_us"] <= last["end_us"]
             and r["name"].startswith(DIST) and r["args"].get("group") == "DATA_PARALLEL_GROUP_WITH_CP"]
    # The two layers have one shape: a gather or reduction of that size is "a layer".
    unit_of = {n: "a layer" if name.startswith("decoder.layers.") else name for name, n in shards.items()}
    unit_of.update({n * 2: unit for n, unit in list(unit_of.items())})   # a reduce-scatter hands in the unit whole
    print("\nrank 0, first micro-batch of the last step, over DATA_PARALLEL_GROUP_WITH_CP:")
    first = calls[:len(calls) // 2 - 1]   # two micro-batches alike; the norm and the loss come last
    for r in first + calls[-2:]:
        shape = r["args"]["shape"]
        unit = unit_of.get(shape[0], "") if r["name"].endswith("_single") else ""
        where = "backward" if _in_backward(r, by_id) else "step" if not unit else "forward"
        print(f"  {r['name'][len(DIST):]:<22} {str(shape):<9} {unit:<18} {where}")
    memory = tmu.report_theoretical_memory(args)[0].memory
    loss = [json.loads(line) for line in open(OUT / "it.jsonl")][-1]["lm_loss"]
    kib = ", ".join(f"{key} {memory[key] / 1024:.0f} KiB" for key in ("params", "grads", "optimizer"))
    print(f"\nrank 0 holds (estimate): {kib}; last loss {loss:.5f}")


if __name__ == "__main__":
    sys.exit(main())
