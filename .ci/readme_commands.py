"""Print one of the README's two fresh-machine commands, exactly as the README writes it.

    python3 .ci/readme_commands.py run     # "## Run it": set up, then `minitron trace ...`
    python3 .ci/readme_commands.py test    # "## Test it": set up with the dev extra, then pytest

.ci/run executes what this prints, so CI runs the README's words and nothing else: the two can
never drift apart. tests/test_readme.py checks what the commands must contain.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
SECTIONS = {"run": "## Run it", "test": "## Test it"}


def readme_command(which: str, text: str | None = None) -> str:
    """The first ```bash block under the section's heading, as one line."""
    text = README.read_text(encoding="utf-8") if text is None else text
    heading = SECTIONS[which]
    start = text.index(heading + "\n")
    body = text[start + len(heading):]
    body = body[: body.find("\n## ")] if "\n## " in body else body
    match = re.search(r"```bash\n(.*?)\n```", body, re.S)
    if not match:
        raise SystemExit(f"README.md: no ```bash block under {heading!r}")
    command = match.group(1).strip()
    if "\n" in command:
        raise SystemExit(f"README.md: the command under {heading!r} must be one line")
    return command


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in SECTIONS:
        raise SystemExit(f"usage: {sys.argv[0]} run|test")
    print(readme_command(sys.argv[1]))
