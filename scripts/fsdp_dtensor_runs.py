"""Megatron-FSDP's fsdp_dtensor checkpoint, saved at one dp size and resumed at others: the
runs behind chapter 18's section, written to docs/fsdp-runs/fsdp_dtensor.json.

    python scripts/fsdp_dtensor_runs.py          # about 30 s on 2 cores

An uninterrupted run (dp 2, optim_grads_params, 4 iterations) saves at iterations 2 and 4; the
checkpoint of iteration 2 is then resumed at dp 4 with optim_grads and at dp 1 with no_shard.
The JSON keeps every run's losses and, of the saved checkpoint, each stored tensor's global
shape and the chunks each writer put in it (DCP's .metadata). tests/test_fsdp_checkpoint.py
makes the same checkpoint from the same flags and holds the file against it;
docs/examples/fsdp_dtensor_view.py prints it.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
JSON = ROOT / "docs" / "fsdp-runs" / "fsdp_dtensor.json"
# the flags of tests/test_fsdp_checkpoint.py's runs (that test reads them from here)
MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "4", "--lr", "1e-2",
         "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo", "--clip-grad", "1.0", "--swiglu",
         "--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"]
FIRST = (2, "optim_grads_params")
RESUMES = [(4, "optim_grads"), (1, "no_shard")]
SHOWN = ["model.module.decoder.layers.0.self_attention.linear_proj.weight",
         "model.module.decoder.layers.0.mlp.linear_fc1.weight_w",
         "optimizer.state.module.decoder.layers.0.mlp.linear_fc1.weight_w.exp_avg"]


def layout(where: Path) -> dict:
    """Every stored tensor: its global shape and its chunks [(writer rank, offset, size)]."""
    from minitron.core.dist_checkpointing.serialization import read_dcp_metadata
    meta = read_dcp_metadata(where)
    out = {}
    for key, md in sorted(meta.state_dict_metadata.items()):
        if not hasattr(md, "chunks"):
            continue   # an object (the RNG states)
        chunks = []
        for chunk in md.chunks:
            writer = next(int(info.relative_path.split("_")[2]) for index, info in meta.storage_data.items()
                          if index.fqn == key and tuple(index.offset) == tuple(chunk.offsets))
            chunks.append([writer, list(chunk.offsets), list(chunk.sizes)])
        out[key] = {"shape": list(md.size), "chunks": sorted(chunks)}
    return out


def main() -> None:
    from distributed import pretrain_records
    from minitron.training.checkpoint_files import TRACKER, iteration_dir

    tmp = Path(tempfile.mkdtemp(prefix="fsdp_dtensor_"))
    try:
        world, strategy = FIRST
        first = pretrain_records(tmp / "first", world, [*MODEL, "--data-parallel-sharding-strategy", strategy,
                                                        "--save-interval", "2", "--save", str(tmp / "ck")])
        (tmp / "ck" / TRACKER).write_text("2")
        result = {"flags": MODEL, "saved": {"dp": world, "strategy": strategy, "iteration": 2},
                  "uninterrupted": [r["lm_loss"] for r in first], "resumed": [],
                  "layout": layout(iteration_dir(tmp / "ck", 2)), "shown": SHOWN}
        for world, strategy in RESUMES:
            records = pretrain_records(tmp / f"dp{world}", world, [
                *MODEL, "--data-parallel-sharding-strategy", strategy, "--load", str(tmp / "ck")])
            result["resumed"].append({"dp": world, "strategy": strategy,
                                      "iterations": [r["iteration"] for r in records],
                                      "losses": [r["lm_loss"] for r in records]})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    JSON.parent.mkdir(parents=True, exist_ok=True)
    JSON.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {JSON.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
