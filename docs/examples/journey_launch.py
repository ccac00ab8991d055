"""How ranks come to be, executed: appendix A's two demos, run through journey.py.

    python docs/examples/journey.py store          # which process hosts the rendezvous store
    python docs/examples/journey.py timing N       # N ranks: fresh interpreters vs forks

The rest of journey.py reads traces of pretrain_gpt (chapters 3, 4 and 6); these two start
ranks of their own and look at the processes, not at a trace, so they live apart.
Every number printed comes from a run made when the command runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path


# --- the rendezvous store: who hosts it ------------------------------------------------------
def _listener_pid(port: int) -> int | None:
    """The pid of the process listening on ``port``, from /proc (Linux)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(fields[9])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd).removeprefix("socket:[").rstrip("]") in inodes:
                    return int(proc.name)
        except OSError:
            continue
    return None


def _store_body(out: str, plain: bool) -> None:
    import torch.distributed as dist

    if plain:  # env:// with nothing else: what a hand-written launch script gets
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        os.environ["MASTER_PORT"] = os.environ["JOURNEY_PLAIN_PORT"]
    dist.init_process_group("gloo")
    host = _listener_pid(int(os.environ["MASTER_PORT"]))
    host_parent = int(Path(f"/proc/{host}/stat").read_text().rsplit(")", 1)[1].split()[1])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "(unset)")
    Path(out, f"{dist.get_rank()}").write_text(f"{os.getpid()} {os.getppid()} {host} {host_parent} {agent}")
    dist.barrier()
    dist.destroy_process_group()


def store() -> None:
    from minitron.launcher import LaunchConfig, Target, free_port, launch

    for plain in (True, False):
        with tempfile.TemporaryDirectory() as out:
            env = {"JOURNEY_PLAIN_PORT": str(free_port())} if plain else {}
            launch(LaunchConfig(world_size=2, env=env, warm=()), Target(function=lambda: _store_body(out, plain)))
            rows = [Path(out, str(r)).read_text().split() for r in range(2)]
        # Who is who, by pid; the page names them by role (pids change from run to run).
        ranks = {int(pid): rank for rank, (pid, *_) in enumerate(rows)}
        launcher, host, host_parent, agent = int(rows[0][1]), int(rows[0][2]), int(rows[0][3]), rows[0][4]
        title = "env:// alone (TORCHELASTIC_USE_AGENT_STORE unset)" if plain else \
            f"minitron launch (TORCHELASTIC_USE_AGENT_STORE={agent})"
        print(title)
        if host in ranks:
            print(f"  the store's host: rank {ranks[host]} itself")
        else:
            whose = "the launcher" if host_parent == launcher else "another process"
            print(f"  the store's host: not a rank: the store keeper, a child of {whose}")
        print()


# --- fork versus fresh interpreters ----------------------------------------------------------
# One fresh interpreter: import torch, fork N children that check they have it, then import
# torch._dynamo. A process of its own, so that nothing this script (or whatever runs it) has
# imported already can make an import look free. It prints its three CPU costs.
_FRESH = """
import os, resource, sys, time
cpu = time.process_time()
import torch
imported = time.process_time()
pids = [os.fork() or os._exit(0 if "torch" in sys.modules else 1) for _ in range(int(sys.argv[1]))]
if any(os.waitpid(pid, 0)[1] for pid in pids):
    sys.exit("a forked child had no torch")
forks = resource.getrusage(resource.RUSAGE_CHILDREN)
after_forks = time.process_time()
import torch._dynamo
print(imported - cpu, after_forks - imported + forks.ru_utime + forks.ru_stime, time.process_time() - after_forks)
"""


def timing(n: int) -> None:
    """What it costs to give N ranks torch, in CPU seconds (unlike wall seconds, they hardly
    depend on how busy the machine is): a fresh interpreter's import, paid once per rank when
    every rank is a fresh interpreter, against one import and N forks; then torch._dynamo, which
    torch's optimizers import on first use."""
    done = subprocess.run([sys.executable, "-c", _FRESH, str(n)], capture_output=True, text=True, check=True)
    print("\n".join(timing_lines(n, *map(float, done.stdout.split()))))


def timing_lines(n: int, imported: float, forks: float, dynamo: float) -> list[str]:
    """The measured CPU seconds, and the one line that is arithmetic on them, labelled so: N
    fresh interpreters are not started here (on a small machine that alone would take a minute);
    each would pay the measured import once."""
    return [f"measured: import torch, in a fresh interpreter:    {imported:5.2f} s of CPU",
            f"measured: {n} ranks forked after one import:        {imported + forks:5.2f} s  "
            f"(+{forks:.2f} s for the forks)",
            f"measured: import torch._dynamo, once, after torch: {dynamo:5.2f} s of CPU",
            f"arithmetic, not run: {n} fresh interpreters = {n} x the import = {n * imported:5.2f} s"]
