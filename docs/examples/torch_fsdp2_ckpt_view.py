"""--use-torch-fsdp2's checkpoint, resumed three ways: chapter 12 runs this.

    python docs/examples/torch_fsdp2_ckpt_view.py

It prints docs/fsdp-runs/torch_fsdp2_ckpt.json (scripts/torch_fsdp2_ckpt_runs.py made the runs;
tests/test_torch_fsdp2_checkpoint.py holds the file against a fresh chain): each run's losses
and gradient norms beside the uninterrupted run's, then the chunks in which an FSDP2 save and
a DDP save stored fc1's weight. Reading a committed file keeps the page's build cheap; the
chain of four launches takes about 15 s on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

JSON = Path(__file__).resolve().parent.parent / "fsdp-runs" / "torch_fsdp2_ckpt.json"


def main() -> None:
    data = json.loads(JSON.read_text())
    runs = data["runs"]
    uninterrupted = {it: (loss, norm) for it, loss, norm in runs["A"]["curve"]}
    print(f"{'run':<4}{'layout':<12}{'loaded':<7}{'iter':>5}{'loss':>12}{'grad norm':>12}"
          f"{'loss - A':>12}{'norm - A':>12}")
    for name, run in runs.items():
        for it, loss, norm in run["curve"]:
            row = f"{name:<4}{run['wrapper'] + ' dp ' + str(run['world']):<12}{run['from'] or '-':<7}{it:>5}" \
                  f"{loss:>12.7f}{norm:>12.7f}"
            if name != "A":   # each resume beside the uninterrupted run at the same iteration
                a_loss, a_norm = uninterrupted[it]
                row += f"{loss - a_loss:>12.1e}{norm - a_norm:>12.1e}"
            print(row)
    print(f"\n{data['shown']}, global shape (2, 71, 32): the chunks each save stored")
    for save, label in (("A@2", "FSDP2 dp 2"), ("D@4", "DDP dp 2")):
        layers = {}
        for offset, size in data["chunks"][save]:
            layers.setdefault(offset[0], []).append(f"{offset[1]}-{offset[1] + size[1] - 1}")
        print(f"  {save} {label:<12}" + "; ".join(f"layer {n}: rows {', '.join(r)}" for n, r in layers.items()))

if __name__ == "__main__":
    main()
