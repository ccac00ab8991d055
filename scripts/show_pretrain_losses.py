"""Set the lm loss of several `minitron pretrain` runs side by side, iteration by iteration.

    python scripts/show_pretrain_losses.py serial=/tmp/a/iterations.jsonl zero3=/tmp/b/iterations.jsonl

Each argument is LABEL=PATH of a run's --log-jsonl file (one JSON object per iteration). The
last column is the largest difference from the first run at that iteration.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    runs = {}
    for arg in argv:
        label, sep, path = arg.partition("=")
        if not sep or not Path(path).is_file():
            print(f"show_pretrain_losses: {arg!r}: give LABEL=PATH of an iterations.jsonl file", file=sys.stderr)
            return 2
        runs[label] = [json.loads(line)["lm_loss"] for line in Path(path).read_text().splitlines() if line]
    if not runs:
        print("show_pretrain_losses: give at least one LABEL=PATH", file=sys.stderr)
        return 2
    labels = list(runs)
    print("iteration  " + "".join(f"{label:>14}" for label in labels) + "   max |difference|")
    for i in range(min(len(losses) for losses in runs.values())):
        row = [runs[label][i] for label in labels]
        print(f"{i + 1:>9}  " + "".join(f"{loss:>14.6f}" for loss in row) + f"   {max(abs(x - row[0]) for x in row):.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
