"""--use-torch-fsdp2's torch_dist checkpoint, resumed at the same dp, under DDP and at another dp:
the runs behind chapter 12's FSDP2 resume, written to docs/fsdp-runs/torch_fsdp2_ckpt.json.

    python scripts/torch_fsdp2_ckpt_runs.py          # about 15 s on 2 cores

One chain of four runs of a 2-layer GPT whose fc1 has 71 rows (dp 2 cuts them 36 + 35, dp 4
18 + 18 + 18 + 17):

    A  FSDP2 dp 2, six iterations, saving at 2, 4, 6         the uninterrupted run
    B  FSDP2 dp 2 from A's iteration 2, exits at 4
    D  DDP   dp 2 from A's iteration 2, exits at 4, saving
    E  FSDP2 dp 4 from D's iteration 4, to 6

The JSON keeps every run's (iteration, loss, gradient norm) and, of fc1's weight, the chunks
each save stored (DCP's .metadata). tests/test_torch_fsdp2_checkpoint.py runs the same chain
from these flags and holds the file against it; docs/examples/torch_fsdp2_ckpt_view.py prints it.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
JSON = ROOT / "docs" / "fsdp-runs" / "torch_fsdp2_ckpt.json"
MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--ffn-hidden-size", "71", "--micro-batch-size", "1", "--global-batch-size", "4", "--lr", "1e-2",
         "--train-iters", "6", "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0",
         "--attention-dropout", "0", "--seed", "7", "--distributed-backend", "gloo", "--clip-grad", "1.0",
         "--untie-embeddings-and-output-weights", "--ckpt-format", "torch_dist"]
FSDP2 = ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]
SHOWN = "decoder.layers.mlp.linear_fc1.weight"   # both layers' fc1, stacked: (2, 71, 32)
# name: (world, wrapper, loaded from, flags); in the order they run
RUNS = {"A": (2, "FSDP2", None, [*FSDP2, "--save", "{tmp}/ckA", "--save-interval", "2"]),
        "B": (2, "FSDP2", "A@2", [*FSDP2, "--exit-interval", "4", "--load", "{tmp}/at2"]),
        "D": (2, "DDP", "A@2", ["--exit-interval", "4", "--load", "{tmp}/at2", "--save", "{tmp}/ckD"]),
        "E": (4, "FSDP2", "D@4", [*FSDP2, "--load", "{tmp}/ckD"])}


def at(root: Path, iteration: int, into: Path) -> None:
    """A checkpoint directory whose latest is ``root``'s ``iteration`` (a copy: A wrote later ones)."""
    from minitron.training.checkpoint_files import TRACKER, iteration_dir

    into.mkdir()
    shutil.copytree(iteration_dir(root, iteration), iteration_dir(into, iteration))
    (into / TRACKER).write_text(str(iteration))


def chain(tmp: Path) -> dict:
    """Run A, B, D, E under ``tmp``: {name: [(iteration, loss, grad norm)]}. The checkpoints stay
    there: ckA (A's saves), at2 (A's iteration 2 alone), ckD (D's iteration 4)."""
    from distributed import pretrain_records

    # Loaded once here, not once in each of the ten forked ranks.
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    out = {}
    for name, (world, _, _, flags) in RUNS.items():
        records = pretrain_records(tmp / name, world, [*MODEL, *(f.format(tmp=tmp) for f in flags)])
        out[name] = [(r["iteration"], r["lm_loss"], r["grad_norm"]) for r in records]
        if name == "A":
            at(tmp / "ckA", 2, tmp / "at2")
    return out


def chunks(where: Path, key: str = SHOWN) -> list:
    """The chunks of ``key`` a save stored: [(offset, size)], in order."""
    from minitron.core.dist_checkpointing.serialization import read_dcp_metadata

    stored = read_dcp_metadata(where).state_dict_metadata[key].chunks
    return sorted([list(c.offsets), list(c.sizes)] for c in stored)


def main() -> None:
    from minitron.training.checkpoint_files import iteration_dir

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        curves = chain(tmp)
        data = {"model": MODEL, "shown": SHOWN,
                "runs": {name: {"world": world, "wrapper": wrapper, "from": source, "curve": curves[name]}
                         for name, (world, wrapper, source, _) in RUNS.items()},
                "chunks": {"A@2": chunks(iteration_dir(tmp / "ckA", 2)), "D@4": chunks(iteration_dir(tmp / "ckD", 4))}}
    JSON.parent.mkdir(parents=True, exist_ok=True)
    JSON.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {JSON}")


if __name__ == "__main__":
    main()
