"""Benchmark the foundation against a bare `import torch`, as ratios measured in one run.

    python scripts/bench_trace.py [--repeat 5] [--skip-fake] [--compare OTHER_CHECKOUT]

Goals (issues 10 and 30):
  minitron trace --tp 2 --pp 4 --world 16                      <= 1.3 x python -c "import torch"
  minitron trace --world 1024 --tp 8 --pp 8 --backend fake     <= 3   x python -c "import torch"
  minitron trace --backend fake --world 131072 --tp 8 --pp 16 --cp 2 --ep 8 --ranks 0,12345,65536,131071
                                                               <= 3   x python -c "import torch", < 1 GB
and @traced with tracing off costs next to nothing. Peak RSS is that of the largest process of a
run (the forked players share the parent's pages, so a sum would count them twice).

Each round runs every command once, in turn, so that a busy machine slows all of them alike;
the figures are medians over the rounds. Wall times are of the whole command: Python start-up,
imports, the ranks, writing, loading, checking and rendering the traces. CPU seconds (user +
system, the command and all its processes) are printed beside them: on a machine shared with
other work they move much less than wall time does. --compare runs the minitron commands a
second time in each round with another checkout first on PYTHONPATH (say, the last release).

minitron's bytecode is compiled first (into its __pycache__, as installing the package does):
where PYTHONDONTWRITEBYTECODE is set, as on the shared development machines, every run would
otherwise compile ~100 of minitron's modules again (~0.1 s), while torch's are compiled at
install. --no-compile measures that case.

Where the time goes (2 cores, Nov 2026). Python's cyclic collector costs a bare `import torch`
~0.3 s while it imports and ~0.5 s at exit (a last full collection over ~170,000 objects); the
minitron command runs with it off and frozen at exit (cli/__init__.py), and the executable
skips the interpreter's tear-down (os._exit once main() is done: 0.05-0.1 s of CPU after a
trace); the second row of the table printed is that import with the same settings, and the
like-for-like lines compare with it.
World 16 (gloo): the parent spends ~1.3 s of CPU (torch and the command line ~1.15 s, 17 forks
~0.1 s of page-table copying, then reading, checking and printing 16 traces ~0.07 s) and its
ranks ~0.5 s together (~30 ms each, half of it in the kernel: copy-on-write faults on the
parent's pages, sockets, threads). Wall time was long above CPU time because every rank then
sat 0.5-0.7 s in destroy_model_parallel: a gloo group's destructor joins its transport thread,
which sees the request only at its next idle tick (10 ms, up to 50 with the timer slack pretrain
sets), and a rank's ~20 groups went one after the other. They are now released together
(comm/timer_slack.release_together): 20-80 ms.
World 1024 (fake): the parent spends ~1.2 s of CPU before and after the play, all of it on the
critical path: torch ~0.9 s and the command line ~0.2 s before; after it ~0.25 s (reading the
copies' 64,000 records back, each copy's file as soon as it is done, writing trace.json, the
cross-rank checks, ~90 ms, and printing). The previous run's thousand rank files are emptied
meanwhile by a forked child (cli/trace_out.py): ext4 freeing their blocks took 0.1-0.15 s of
wall time (0.05 s of CPU) just before the copies started, and now rides on the idle core while
the parent imports torch. The two copies play for ~5.4 s of CPU together, ~5.3 ms a rank
(py-spy, Nov 2026): initialize_model_parallel ~47% (walking the 3,377 groups a rank is not in,
three Python calls each, ~20%; torch's own new_group for the ~20 it is in ~25%), the rank's rows
of trace.json ~10%, encoding its records ~8%, torch.manual_seed ~8% (formatting the Python stack
for CUDA's lazy seeding), tearing the rank down ~6%, argparse ~4%. Gone since: each rank's
records encoded twice (a row of trace.json is now built around its record's encoded arguments:
0.38 -> 0.16 ms a rank; trace.json is compact, 29.6 -> 26.2 MB), pickle's memo of every object
when a copy hands its records back (marshal: ~130 -> ~50 ms at the end of each copy's play), the
checks hashing every group of every rank to look for a missing one (only when a rank kept a
wrong group, which a missing one implies: 113 -> 67 ms), the cyclic collector walking every
kept rank's records again and again (each rank's are frozen once collected), and ext4 creating a
thousand files just after deleting a thousand (the files are emptied and written in place).
Measured with --compare against the commit before these (--repeat 5, 2 cores, load 0.8-1.4):
4.35 -> 3.88 s, 3.05x -> 2.72x `import torch` (1.42 s); CPU 7.13 -> 6.49 s.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
LIKE = "import torch, collector as minitron's"
RANKS = "trace, 4 of 131072 ranks (fake)"
MAX_RSS_MB = 1024  # the --ranks goal: under 1 GB


def run(cmd: list[str], pythonpath: str | None = None) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of the command and its children, peak RSS in MB of the largest
    of its processes) of one run of ``cmd``. wait4 gives this run's own figures: the process-wide
    RUSAGE_CHILDREN would keep the largest RSS of every run so far."""
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        if proc.returncode:
            out.seek(0)
            sys.exit(f"{' '.join(cmd)} failed:\n{out.read()[-4000:].decode(errors='replace')}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def traced_call_overhead(calls: int = 1_000_000) -> tuple[float, float]:
    """ns per call of a plain function and of the same function under @traced, tracing off."""
    from minitron.trace import traced

    def plain(x):
        return x

    wrapped = traced(plain)
    out = []
    for fn in (plain, wrapped):
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        out.append((time.perf_counter() - start) / calls * 1e9)
    return out[0], out[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--skip-fake", action="store_true", help="leave out the fake worlds (1024 ranks; 4 of 131072)")
    parser.add_argument("--compare", metavar="DIR", help="also run the minitron commands from this checkout")
    parser.add_argument("--no-compile", action="store_true", help="leave minitron's bytecode as it is")
    opts = parser.parse_args()
    if not opts.no_compile:
        import minitron

        for package in [Path(minitron.__file__).parent] + ([Path(opts.compare) / "minitron"] if opts.compare else []):
            compileall.compile_dir(str(package), quiet=1)
        print(f"bytecode compiled: {Path(minitron.__file__).parent}" + (f" and {opts.compare}" if opts.compare else ""),
              file=sys.stderr)
    minitron = str(BIN / "minitron")
    with tempfile.TemporaryDirectory() as tmp:
        commands = {
            "import torch": [sys.executable, "-c", "import torch"],
            # What minitron's own process does around the same import (cli.main): the cyclic
            # collector off, and the objects frozen at exit. The goals are against the bare
            # import above; this row shows how much of the margin those two settings give.
            LIKE: [sys.executable, "-c", "import gc; gc.disable(); import torch; gc.freeze()"],
            "trace, world 16 (gloo)": [minitron, "trace", "--tp", "2", "--pp", "4", "--world", "16",
                                       "--out", f"{tmp}/t16"],
        }
        goals = {"trace, world 16 (gloo)": 1.3}
        if not opts.skip_fake:
            commands["trace, world 1024 (fake)"] = [minitron, "trace", "--backend", "fake", "--tp", "8",
                                                    "--pp", "8", "--world", "1024", "--out", f"{tmp}/f1024"]
            goals["trace, world 1024 (fake)"] = 3.0
            # Four ranks of a production layout, alone (issue 30): tp 8, pp 16, cp 2, ep 8.
            commands[RANKS] = [minitron, "trace", "--backend", "fake", "--world", "131072", "--tp", "8", "--pp", "16",
                               "--cp", "2", "--ep", "8", "--ranks", "0,12345,65536,131071", "--out", f"{tmp}/r131k"]
            goals[RANKS] = 3.0
        paths = {name: None for name in commands}
        if opts.compare:
            for name in [g for g in goals if g != RANKS]:  # --ranks may be newer than the other checkout
                # An --out of its own: trace clears its folder first, so a shared one would make
                # each checkout clear (and pay for) the other's files, maybe while they still land.
                commands[f"{name} [compare]"] = [f"{w}-compare" if w.startswith(f"{tmp}/") else w
                                                 for w in commands[name]]
                paths[f"{name} [compare]"] = str(Path(opts.compare).resolve())
        times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in commands}
        loads = [os.getloadavg()[0]]
        for round_ in range(opts.repeat):
            for name, cmd in commands.items():
                times[name].append(run(cmd, paths[name]))
            loads.append(os.getloadavg()[0])
            print(f"round {round_ + 1}/{opts.repeat} (load {loads[-1]:.1f}): " + ", ".join(
                f"{name} {times[name][-1][0]:.2f} s / {times[name][-1][1]:.2f} s CPU" for name in commands),
                file=sys.stderr)

    wall = {name: statistics.median(w for w, _, _ in t) for name, t in times.items()}
    cpu = {name: statistics.median(c for _, c, _ in t) for name, t in times.items()}
    rss = {name: max(m for _, _, m in t) for name, t in times.items()}
    base = "import torch"
    print(f"{os.cpu_count()} cores; medians of {opts.repeat} rounds; 1-minute load average "
          f"{min(loads):.1f}..{max(loads):.1f} while measuring (a busy machine inflates wall ratios; "
          "the CPU ratios move less)")
    print(f"{'':37s} {'wall':>8s} {'ratio':>7s} {'goal':>6s}   {'CPU':>8s} {'ratio':>7s} {'peak RSS':>9s}")
    for name in commands:
        ratio = wall[name] / wall[base]
        per_round = statistics.median(w / b for (w, _, _), (b, _, _) in zip(times[name], times[base]))
        goal = goals.get(name.removesuffix(" [compare]"))
        mark = "" if goal is None else ("  ok" if ratio <= goal else "  over")
        print(f"{name:37s} {wall[name]:7.2f}s {ratio:6.2f}x {'' if goal is None else f'{goal:.1f}x':>6s}   "
              f"{cpu[name]:7.2f}s {cpu[name] / cpu[base]:6.2f}x {rss[name]:7.0f}MB{mark}"
              + ("" if name == base else f"   (median of per-round ratios {per_round:.2f}x)"))
    for name, goal in goals.items():
        wall_ratio, cpu_ratio = wall[name] / wall[base], cpu[name] / cpu[base]
        print(f"GOAL {name}: {wall_ratio:.2f}x wall, {cpu_ratio:.2f}x CPU of `import torch` (goal <= {goal:.1f}x): "
              f"{'met' if wall_ratio <= goal else 'over'}")
    if RANKS in rss:
        print(f"GOAL {RANKS}: peak RSS {rss[RANKS]:.0f} MB, the largest of its processes (goal < {MAX_RSS_MB} MB): "
              f"{'met' if rss[RANKS] < MAX_RSS_MB else 'over'}")
    for name in goals:
        print(f"like for like, {name}: {wall[name] / wall[LIKE]:.2f}x wall, {cpu[name] / cpu[LIKE]:.2f}x CPU of "
              f"`{commands[LIKE][-1]}`")
    plain_ns, traced_ns = traced_call_overhead()
    print(f"@traced, tracing off: {traced_ns:.0f} ns/call vs {plain_ns:.0f} ns plain (+{traced_ns - plain_ns:.0f} ns)")


if __name__ == "__main__":
    main()
