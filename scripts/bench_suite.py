"""Time the README's test command against one `import torch`, both measured in this run.

    python scripts/bench_suite.py [--fresh-clone] [--pytest-args "ARGS"]

The budget (issue 35): the README's test command on a fresh clone takes at most 90 times one
`import torch` measured in the same run. A ratio, not seconds, because the machines differ
and a shared one is slower at one moment than the next: what slows the suite slows the import
too. The import is timed three times in fresh interpreters (the median counts), then pytest.

Two places to run pytest:

* default: this checkout, with its .venv, as it stands (uncommitted changes included, and
  docs/page-outputs/ as it is);
* --fresh-clone: HEAD cloned into a temporary folder, its venv made by the README's own set-up
  steps (timed, but outside the budget: the budget is the test run), then pytest there, as on
  a reader's first `pytest`: the docs build runs the commands of every page whose committed
  outputs (docs/page-outputs/) do not match the code, and the line after the times says how
  many did. MINITRON_DOCS_CACHE=0 in the environment runs them all.

The command is read from README.md (section "Test it"), so this follows the README when it
changes. --pytest-args adds arguments to its pytest (files to select, -n 0, ...): a selection
gives a ratio for that selection only, and the budget line says so; --durations=N only adds
pytest's list of the slowest tests, printed after the times, and still counts as the whole suite.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 90           # the README's test command: at most this many `import torch`
IMPORTS = 3           # import torch is timed this often; the median counts
DURATION = re.compile(r"\d+\.\d+s (setup|call|teardown) ")   # a line of pytest's --durations report


def readme_steps(readme: Path) -> tuple[list[str], str]:
    """(set-up steps, pytest step) of the README's test command: the `&&`-joined line in the
    fenced block under "## Test it"."""
    text = readme.read_text()
    section = text.split("\n## Test it", 1)[-1] if "\n## Test it" in text else ""
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    if not block:
        sys.exit(f"bench_suite: {readme} has no ```bash block under '## Test it'; the test command is read there")
    steps = [s.strip() for s in block[1].strip().split("&&")]
    if not steps[-1].startswith(".venv/bin/pytest"):
        sys.exit(f"bench_suite: the README's test command does not end in .venv/bin/pytest: {block[1].strip()!r}")
    return steps[:-1], steps[-1]


def timed(command: list[str] | str, cwd: Path, log=None) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of the command and every process it waited for, exit code).
    A string runs through bash, as the README's line would. Output goes to ``log`` (a file)."""
    argv = ["bash", "-c", command] if isinstance(command, str) else command
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    # wait4: this command's own CPU figures (the process-wide RUSAGE_CHILDREN adds up every run).
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)   # reaped here: Popen must not wait again
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime, proc.returncode


def tail(log, lines: int = 15) -> str:
    log.seek(0)
    return "\n".join(log.read().decode(errors="replace").splitlines()[-lines:])


def fresh_clone(into: Path) -> Path:
    """HEAD of this checkout cloned into ``into``, its venv made by the README's set-up steps."""
    clone = into / "minitron"
    done = subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)],
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"bench_suite: git clone of {ROOT} failed: {done.stderr.strip()}")
    setup, _ = readme_steps(clone / "README.md")
    for step in setup:
        with tempfile.TemporaryFile() as log:
            wall, _, code = timed(step, clone, log)
            if code:
                sys.exit(f"bench_suite: the README's set-up step `{step}` exited {code} in the clone; "
                         f"its last lines:\n{tail(log)}")
        print(f"set-up (not in the budget): {step}: {wall:.1f} s", file=sys.stderr)
    return clone


def page_outputs(where: Path) -> set[str]:
    """The entries of docs/page-outputs/: the build adds one for each page whose commands ran."""
    folder = where / "docs" / "page-outputs"
    return {entry.name for entry in folder.glob("*.json")} if folder.is_dir() else set()


def measure(where: Path, pytest_args: list[str]) -> int:
    python = where / ".venv" / "bin" / "python"
    if not python.exists():
        sys.exit(f"bench_suite: {where} has no .venv; make it as the README says (or use --fresh-clone)")
    imports = [timed([str(python), "-c", "import torch"], where) for _ in range(IMPORTS)]
    if any(code for _, _, code in imports):
        sys.exit(f"bench_suite: `{python} -c 'import torch'` failed; is torch installed in that venv?")
    _, pytest_step = readme_steps(where / "README.md")
    command = f"{pytest_step} {shlex.join(pytest_args)}".strip()
    load_before = os.getloadavg()[0]
    outputs_before = page_outputs(where)
    with tempfile.TemporaryFile() as log:
        wall, cpu, code = timed(command, where, log)
        summary = tail(log, 3)
        log.seek(0)
        slowest = [line for line in log.read().decode(errors="replace").splitlines() if DURATION.match(line)]
    torch_wall = statistics.median(w for w, _, _ in imports)
    torch_cpu = statistics.median(c for _, c, _ in imports)
    ratio = wall / torch_wall
    print(f"import torch: {torch_wall:.2f} s wall, {torch_cpu:.2f} s CPU (median of "
          f"{', '.join(f'{w:.2f}' for w, _, _ in imports)} s; {python})")
    print(f"`{command}` in {where}: {wall:.1f} s wall, {cpu:.1f} s CPU, exit code {code}")
    print(f"{os.cpu_count()} cores; 1-minute load average {load_before:.1f} before pytest, "
          f"{os.getloadavg()[0]:.1f} after (a busy machine inflates both times; the ratio moves less)")
    if os.environ.get("MINITRON_DOCS_CACHE") == "0":
        print("docs build: every page ran its commands (MINITRON_DOCS_CACHE=0)")
    else:
        ran = page_outputs(where) - outputs_before
        print(f"docs build: {len(ran)} page(s) ran their commands (their outputs were not in docs/page-outputs/)")
    for line in slowest:  # --durations=N asked for them: where the time went
        print(f"  {line}")
    # --durations only reports; any other argument (files, -k, -m, -n 0, -x) changes the run.
    whole = all(arg.startswith("--durations") for arg in pytest_args)
    scope = "the whole suite" if whole else "this selection only, not the budget's whole suite"
    verdict = "within" if ratio <= BUDGET else "OVER"
    print(f"RATIO {ratio:.1f}x import torch wall ({cpu / torch_cpu:.1f}x in CPU); budget at most {BUDGET}x: "
          f"{verdict} ({scope})")
    if code:
        print(f"pytest failed (exit code {code}):\n{summary}", file=sys.stderr)
    return 1 if code or ratio > BUDGET else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh-clone", action="store_true",
                        help="clone HEAD into a temporary folder, make its venv as the README says, test there")
    parser.add_argument("--pytest-args", default="", metavar="ARGS",
                        help="added to the README's pytest; with = when it starts with a dash: "
                             '--pytest-args="-n 0 tests/test_diff.py"')
    opts = parser.parse_args()
    try:
        pytest_args = shlex.split(opts.pytest_args)
    except ValueError as exc:
        sys.exit(f"bench_suite: --pytest-args {opts.pytest_args!r}: {exc}")
    if not opts.fresh_clone:
        sys.exit(measure(ROOT, pytest_args))
    with tempfile.TemporaryDirectory(prefix="minitron-bench-suite-") as tmp:
        sys.exit(measure(fresh_clone(Path(tmp)), pytest_args))


if __name__ == "__main__":
    main()
