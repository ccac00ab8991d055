"""Regenerate the README's output excerpt from a real run of its main command.

    python scripts/readme_excerpt.py           # print the excerpt
    python scripts/readme_excerpt.py --write   # put it into README.md

The excerpt is rank 0's call tree down to the first few new_group lines, then the checks and
the closing line, from `minitron trace --tp 2 --pp 4 --world 16` at 100 columns (the width the
docs use too). tests/test_readme.py fails when the README's excerpt no longer matches a run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ["trace", "--tp", "2", "--pp", "4", "--world", "16"]
NEW_GROUP_LINES = 4  # how many kinds of group the excerpt shows before "..."


def run_main_job() -> str:
    minitron = Path(sys.executable).parent / "minitron"
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run([str(minitron), *COMMAND], cwd=cwd, capture_output=True, text=True,
                              env={**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}, check=True)
    return proc.stdout


def excerpt(output: str) -> list[str]:
    lines = output.splitlines()
    tree, seen = [], 0
    for i, line in enumerate(lines):
        if "new_group" in line:
            seen += 1
            if seen > NEW_GROUP_LINES:
                indent = re.match(r"^[│ ]*", line).group(0)
                tree.append(indent + "...")
                break
        tree.append(line)
        if seen == NEW_GROUP_LINES and i + 1 < len(lines) and "new_group" not in lines[i + 1] \
                and not lines[i + 1].lstrip("│ ").startswith(("├", "└")):
            continue  # the wrapped rest of the last group line belongs with it
    # The checks (✓ passed, ✗ failed, – not run) and the closing line, wrapped lines included.
    closing = lines[next(i for i, line in enumerate(lines) if line[:1] in "✓✗–"):]
    return tree + closing


def write(text: list[str]) -> None:
    readme = ROOT / "README.md"
    body = readme.read_text(encoding="utf-8")
    start = body.index("```text", body.index("What it prints")) + len("```text\n")
    end = body.index("```", start)
    readme.write_text(body[:start] + "\n".join(text) + "\n" + body[end:], encoding="utf-8")


if __name__ == "__main__":
    lines = excerpt(run_main_job())
    if "--write" in sys.argv[1:]:
        write(lines)
        print(f"README.md: excerpt of {len(lines)} lines written")
    else:
        print("\n".join(lines))
