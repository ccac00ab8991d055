"""The README's promises to a newcomer, kept true.

- Its two fresh-machine commands are what .ci/run executes (read out of the README, so they
  cannot drift apart), and say what they must: the run command installs no extras.
- Everything minitron imports is a declared dependency. The first command once broke for every
  newcomer because `click` came only through the dev extra while the tests stayed green; this
  test fails on that class of mistake without needing a fresh venv.
- The output excerpt is what a current run prints (durations aside): test_trace16.py, beside
  the run it reads.
- The files "More to try" points at exist.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the README's floor is 3.10

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
sys.path.insert(0, str(ROOT / ".ci"))
from readme_commands import readme_command  # noqa: E402

# Top-level packages whose import name differs from the distribution name in pyproject.
IMPORT_NAMES = {"yaml": "pyyaml", "pil": "pillow"}


def test_run_command_installs_no_extras_and_runs_the_main_job():
    command = readme_command("run")
    assert command.startswith("python3 -m venv .venv && ")
    assert "pip install -e . &&" in command and "[dev]" not in command
    assert command.endswith(".venv/bin/minitron trace --tp 2 --pp 4 --world 16")


def test_test_command_installs_the_dev_extra_and_runs_pytest():
    command = readme_command("test")
    assert command.startswith("python3 -m venv .venv && ")
    assert "pip install -e '.[dev]'" in command
    assert command.endswith(".venv/bin/pytest")


def test_ci_runs_both_readme_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "readme_commands.py run" in ci and "readme_commands.py test" in ci
    assert 'bash -c "$run_command"' in ci and 'bash -c "$test_command"' in ci
    assert "set -euo pipefail" in ci  # any failure, pytest's "no tests" exit 5 included, fails CI


def _declared() -> set:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].strip().lower().replace("-", "_")
            for d in meta["dependencies"]}


def _imports(path: Path):
    """(module, line) of every absolute import not guarded by `except ImportError`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, node.lineno


def test_every_import_is_a_declared_dependency():
    declared = _declared()
    undeclared = []
    for path in sorted((ROOT / "minitron").rglob("*.py")):
        for module, line in _imports(path):
            top = module.split(".")[0]
            name = IMPORT_NAMES.get(top.lower(), top.lower())
            if top in sys.stdlib_module_names or top == "minitron" or name in declared:
                continue
            undeclared.append(f"{path.relative_to(ROOT)}:{line} imports {top}")
    assert not undeclared, "imported but not in [project].dependencies: " + "; ".join(undeclared)


def test_more_to_try_points_at_files_that_exist():
    block = README[README.index("More to try"):]
    block = block[block.index("```bash"): block.index("```", block.index("```bash") + 3)]
    for script in re.findall(r"minitron launch [^\n]*?(\S+\.py)", block):
        assert (ROOT / script).is_file(), f"README runs {script}, which the repository does not ship"


def excerpt_chunks() -> list[str]:
    """The README's output excerpt, cut where it says "..." (lines it leaves out)."""
    start = README.index("What it prints")
    block = README[README.index("```text", start) + len("```text\n"):]
    block = block[: block.index("```")]
    chunks, current = [], []
    for line in block.splitlines():
        if line.strip(" │├└─").rstrip().endswith("...") or line.strip(" │") == "...":
            chunks.append("\n".join(current))
            current = []
        else:
            current.append(line)
    return [c for c in chunks + ["\n".join(current)] if c.strip()]


def normalise(text: str) -> str:
    """What must not change from run to run: everything but durations, and free of the line
    breaks and tree glyphs that a wrap at another place would move."""
    text = re.sub(r"[\s│├└─]+", "", text)
    return re.sub(r"\d+\.\d+m?s", "T", text)  # durations always carry a decimal: 36.3 ms, 1.61 s
