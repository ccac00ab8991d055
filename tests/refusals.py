"""Many `minitron` command lines, each run as a user would run it, checked for the house rule:
a bad input is ONE line on stderr, exit code 2, no traceback, no process left behind, and no
torch imported (the refusal happened before the expensive part, so it costs a fraction of an
`import torch`: the tests check the cause, `scripts/bench_refusals.py` prints the times).

Why not one subprocess per case: a fresh interpreter costs ~0.5 s (typer, rich, the
validation imports), so a table of 300 refusals would take minutes. Why not in pytest's own
process (tests/cli_here.py): pytest has torch imported already, so "refused before torch" could
not be seen, and a case that wrongly starts work would run inside the test process.

So one torch-free interpreter imports ``minitron.cli`` once, then forks a child per case. The
child is a new session (its own process group, so anything it leaves running is found and
killed), runs ``minitron.cli.main`` with the case's argv, cwd and env, under a memory cap, and
reports its exit code, whether torch got imported, and its time. Output goes to files the
parent reads back.

    outcomes = run_cases([Case("trace --world 0".split()), ...])
    for outcome in outcomes: outcome.check(must_contain=...)

A fork costs a case ~9 ms of CPU even for `--bogus` (page tables, and copy-on-write of every page
the child touches: CPython writes reference counts), and ~16 ms on average, against ~3 ms for the
refusal itself in a warm interpreter. So ``fork=False`` runs the cases one after another in the
harness itself, still torch-free: the same checks (exit code, lines, torch imported, a process
left running, a timeout), at the price of isolation between cases (each gets its argv, cwd, env,
stdio and signal handlers back as they were). A case that imports torch ends that harness (the
rest could not be checked) and a fresh one takes the rest. A table keeps a few rows forked, so
the per-case fork path stays covered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# The child side: runs in the harness interpreter (no pytest, no torch). Reads cases as JSON
# lines on stdin, writes one JSON result line per case on stdout.
_CHILD = r'''
import json, os, resource, signal, sys, time
import minitron.cli  # once, before any fork: every case shares the import
from minitron.cli import main
from typer_command_cache import build_once
build_once(minitron.cli.app)   # typer's command from the app: built once, each child gets its own copy
MEMORY_CAP = int(sys.argv[1])
for name in sys.argv[2:]:  # preloaded for cases whose refusal needs them (see run_cases)
    __import__(name)
real_stdout = sys.stdout
imported = set(sys.modules)
for line in sys.stdin:
    case = json.loads(line)
    out_path, err_path = case["out"], case["err"]
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.setsid()  # its own process group: whatever it leaves behind is found by pgid
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
        fd_out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        fd_err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd_out, 1); os.dup2(fd_err, 2)
        os.close(0)
        sys.stdin = open(os.devnull)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        os.chdir(case["cwd"])
        os.environ.clear(); os.environ.update(case["env"])
        sys.argv = ["minitron", *case["argv"]]
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except BaseException:
            import traceback  # what the interpreter would print for an uncaught exception
            traceback.print_exc()
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        with open(case["err"] + ".torch", "w") as marker:
            marker.write("1" if "torch" in sys.modules else "0")
        if "torch" not in sys.modules:  # what this case imported, for the harness to warm
            with open(case["err"] + ".modules", "w") as modules:
                modules.write("\n".join(sorted(set(sys.modules) - imported)))
        os._exit(code)
    deadline = time.monotonic() + case["timeout"]
    status, timed_out = None, False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            timed_out = True
            os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.002)
    seconds = time.perf_counter() - started
    left = False
    try:  # anything of the case's process group still alive is a leftover process
        os.killpg(pid, 0)
        left = True
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    code = os.waitstatus_to_exitcode(status)
    real_stdout.write(json.dumps({"code": code, "seconds": seconds, "timed_out": timed_out,
                                  "left": left}) + "\n")
    real_stdout.flush()
    # Warm the harness with what the case imported on its way to the refusal (the argument
    # stack, the launcher, the estimator: ~0.3 s a case otherwise, paid again in every child),
    # so the next case finds it loaded. Only a torch-free case's modules, and none that pulls
    # torch in after all: the harness must stay torch-free, or no case could show it refused first.
    try:
        with open(err_path + ".modules") as modules:
            names = modules.read().split()
    except OSError:
        names = []
    for name in names:
        if name not in sys.modules and not name.startswith("__"):
            try:
                __import__(name)
            except BaseException:
                pass  # its child's import may have depended on the case's cwd or env: leave it cold
    if "torch" in sys.modules and "torch" not in imported:
        sys.exit("refusals harness: warming it imported torch; a case's modules are not torch-free")
    imported = set(sys.modules)
'''


# The forked child runs from `python -c`, whose path does not hold tests/ (typer_command_cache.py).
_TESTS_ON_PATH = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"

# The sequential side (fork=False): refusals_sequential.py, run as a script.
SEQUENTIAL = str(Path(__file__).with_name("refusals_sequential.py"))


@dataclass
class Case:
    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None      # added to the harness's environment
    timeout: float = 30.0
    id: str = ""

    def __post_init__(self):
        self.argv = [str(a) for a in self.argv]
        self.id = self.id or " ".join(self.argv)


@dataclass
class Outcome:
    case: Case
    code: int
    stdout: str
    stderr: str
    seconds: float
    torch_imported: bool
    timed_out: bool
    left_processes: bool
    problems: list[str] = field(default_factory=list)

    def refusal_problems(self, must_contain: tuple[str, ...] = (), torch_allowed: bool = False) -> list[str]:
        """What is wrong with this outcome as a refusal (empty: it is a good one)."""
        found = []
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        if self.timed_out:
            found.append(f"still running after {self.case.timeout:g} s")
        if self.code != 2:
            found.append(f"exit code {self.code}, not 2")
        if "Traceback" in self.stderr or "Traceback" in self.stdout:
            found.append("a traceback")
        if len(lines) != 1:
            found.append(f"{len(lines)} lines on stderr, not 1")
        if self.left_processes:
            found.append("left a process running")
        if self.torch_imported and not torch_allowed:
            found.append("imported torch before refusing")
        for words in must_contain:
            if words.lower() not in self.stderr.lower():
                found.append(f"does not say {words!r}")
        return found

    def describe(self) -> str:
        return f"minitron {self.case.id}\n  stderr: {self.stderr.strip()[:600]!r}\n  stdout: {self.stdout.strip()[:300]!r}"


def run_cases(cases: list[Case], memory_cap: int = 2 << 30, preload: tuple[str, ...] = (),
              harnesses: int = 2, fork: bool = True) -> list[Outcome]:
    """Run the cases in ``harnesses`` harness processes side by side (the machine has 2 cores
    and pytest waits meanwhile), dealt round-robin; return their outcomes in the cases' order.
    ``fork=False``: one harness runs them one after another, unforked (see the module's doc)."""
    if not fork:
        assert not preload, "a preloaded harness is not torch-free: fork its cases"
        outcomes: list[Outcome] = []
        while len(outcomes) < len(cases):   # a case that imported torch ends a harness
            outcomes += _run_in_one_harness(cases[len(outcomes):], memory_cap, (), fork=False)
        return outcomes
    if harnesses <= 1 or len(cases) < 20:
        return _run_in_one_harness(cases, memory_cap, preload)
    # lazy: only a table large enough to split uses a thread pool
    from concurrent.futures import ThreadPoolExecutor

    shares = [cases[i::harnesses] for i in range(harnesses)]
    with ThreadPoolExecutor(harnesses) as pool:
        done = list(pool.map(lambda share: _run_in_one_harness(share, memory_cap, preload), shares))
    merged: list[Outcome] = [None] * len(cases)  # type: ignore[list-item]
    for i, share in enumerate(done):
        merged[i::harnesses] = share
    return merged


def _run_in_one_harness(cases: list[Case], memory_cap: int, preload: tuple[str, ...],
                        fork: bool = True) -> list[Outcome]:
    """Run every case in one forked-per-case harness; return their outcomes in order.

    ``preload``: modules the harness imports before its first fork, for cases whose refusal
    needs them (a shard checked with torch.load): each case then pays for the import once in
    all, not ~1.5 s each. Their outcomes say torch was imported, as it was; the caller allows it."""
    scratch = Path(tempfile.mkdtemp(prefix="minitron-refusals-"))
    base_env = {**os.environ, "COLUMNS": "200"}
    lines = []
    for number, case in enumerate(cases):
        lines.append(json.dumps({
            "argv": case.argv, "cwd": str(case.cwd or scratch), "timeout": case.timeout,
            "env": {**base_env, **(case.env or {})},
            "out": str(scratch / f"{number}.out"), "err": str(scratch / f"{number}.err"),
        }))
    proc = subprocess.run([sys.executable, *(["-c", _TESTS_ON_PATH + _CHILD] if fork else [SEQUENTIAL]),
                           str(memory_cap), *preload],
                          input="\n".join(lines) + "\n", capture_output=True, text=True,
                          timeout=sum(case.timeout for case in cases) + 60)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    ended_early = not fork and proc.returncode == 0 and results   # it met torch: the caller goes on
    assert len(results) == len(cases) or ended_early, f"harness died after {len(results)} cases: {proc.stderr[-3000:]}"
    cases = cases[:len(results)]
    outcomes = []
    for number, (case, result) in enumerate(zip(cases, results)):
        marker = scratch / f"{number}.err.torch"
        outcomes.append(Outcome(
            case=case, code=result["code"], seconds=result["seconds"],
            stdout=(scratch / f"{number}.out").read_text(errors="replace"),
            stderr=(scratch / f"{number}.err").read_text(errors="replace"),
            torch_imported=marker.exists() and marker.read_text() == "1",
            timed_out=result["timed_out"], left_processes=result["left"]))
    return outcomes
