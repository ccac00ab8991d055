"""Chapter 18's fsdp_dtensor section: what scripts/fsdp_dtensor_runs.py committed, printed.

    python docs/examples/fsdp_dtensor_view.py

Three of the stored tensors with every chunk and the rank that wrote it (a shard boundary of a
unit may fall inside a parameter, between two of its rows), then the losses of the run that
saved and of the runs that resumed its checkpoint at other dp sizes and strategies.
"""

from __future__ import annotations

import json
from pathlib import Path

RUNS = json.loads((Path(__file__).resolve().parents[1] / "fsdp-runs" / "fsdp_dtensor.json").read_text())


def main() -> None:
    saved = RUNS["saved"]
    print(f"saved at dp {saved['dp']} ({saved['strategy']}), iteration {saved['iteration']}: "
          f"{len(RUNS['layout'])} tensors")
    for key in RUNS["shown"]:
        entry = RUNS["layout"][key]
        print(f"\n{key}")
        print(f"  global shape {tuple(entry['shape'])}")
        for writer, offset, size in entry["chunks"]:
            print(f"  rank {writer} wrote rows {offset[0]}..{offset[0] + size[0] - 1}, "
                  f"columns {offset[1]}..{offset[1] + size[1] - 1}")
    print("\nlm loss at iterations 3, 4")
    print(f"  uninterrupted, dp {saved['dp']} {saved['strategy']:<18} "
          + "  ".join(f"{x:.6f}" for x in RUNS["uninterrupted"][2:]))
    for run in RUNS["resumed"]:
        print(f"  resumed,       dp {run['dp']} {run['strategy']:<18} "
              + "  ".join(f"{x:.6f}" for x in run["losses"]))


if __name__ == "__main__":
    main()
