"""The second half of scripts/megatron_surface.py --run: every accepted launch unit through
`minitron estimate` and `minitron trace --backend fake --ranks` at the world its script names,
as a user would run them (in this process, through the command line's own entry point).

Accepting the flags is one thing; the accountant answering and the fake trace building each
played rank's groups is the next, and it can fail where validate_args does not look (a layout
the estimate cannot count, a group the fake world cannot make). The trace plays the first,
middle and last ranks of the world, which reach the first and last pipeline stages.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_accepted(units: list[dict], root: Path, mock, environment) -> list[str]:
    """Lines to print: each accepted unit that failed either command, then the totals."""
    sys.path.insert(0, str(ROOT / "tests"))   # minitron_here: the entry point, output captured
    from cli_here import minitron_here

    scratch = Path(tempfile.mkdtemp(prefix="megatron-surface-run-"))
    accepted = [u for u in units if not u["blockers"]]
    lines, ran = [], 0
    for i, unit in enumerate(accepted):
        argv, world = mock(unit["argv"], str(scratch)), unit["world"]
        played = ",".join(map(str, sorted({0, world // 2, world - 1})))
        with environment(unit["env"]):
            answers = {"estimate": minitron_here("estimate", "--world", str(world), *argv),
                       "trace": minitron_here("trace", "--backend", "fake", "--world", str(world), "--ranks", played,
                                              "--out", str(scratch / f"trace-{i}"), *argv)}
        failed = [f"{what}: {(done.stderr.strip().splitlines() or ['exit %d' % done.returncode])[-1][:200]}"
                  for what, done in answers.items() if done.returncode != 0]
        if answers["trace"].returncode == 0 and "✗" in answers["trace"].stdout:
            failed.append("trace: a check failed across the played ranks")
        if failed:
            lines.append(f"{unit['path'].relative_to(root)} (world {world}): " + "; ".join(failed))
        else:
            ran += 1
    lines.append(f"accepted units that estimate and trace --backend fake both ran: {ran} of {len(accepted)}")
    return lines
