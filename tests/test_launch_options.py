"""`minitron launch`'s per-process options from DeepSpeed's launch.py: --save_pid, --bind_cores_to_rank
(with --bind_core_list) and --no_python.

Most runs go through the CLI in this process (typer's runner), so the ranks fork from a warm
parent; their output is read from --log-dir. The SIGTERM case needs a launcher of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minitron.cli import app
from minitron.launcher.runner import ResourceError, cores_for_rank, parse_range_list
from cli_here import MINITRON
from distributed import in_fork

CORES = sorted(os.sched_getaffinity(0))


def launch(*args):
    return CliRunner().invoke(app, ["launch", *map(str, args)])


def rank_lines(log_dir: Path, world: int) -> list[str]:
    return [(log_dir / f"rank{r}.log").read_text().strip() for r in range(world)]


def test_core_lists_split_as_deepspeed():
    assert parse_range_list("1,3-5,7") == [1, 3, 4, 5, 7]
    for bad in ("3,1", "1-3,2", "5-4", "x", "1,,2"):
        with pytest.raises(ResourceError):
            parse_range_list(bad)
    # len // ranks consecutive cores each, in local-rank order; the remainder (core 9) idles.
    assert [cores_for_rank(list(range(10)), 3, r) for r in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    with pytest.raises(ResourceError, match="2 cores for 3 ranks"):
        cores_for_rank([0, 1], 3, 0)


def test_save_pid_and_bound_cores_seen_from_the_ranks(tmp_path):
    """Each rank finds /tmp/<launcher pid>.deepspeed holding that pid, runs on its share of the
    cores with OMP_NUM_THREADS its size; the file is gone once the launch returns."""
    world = min(2, len(CORES))
    script = tmp_path / "probe.py"
    script.write_text("import os\np = f'/tmp/{os.getppid()}.deepspeed'\n"
                      "print(open(p).read() == str(os.getppid()), sorted(os.sched_getaffinity(0)),"
                      " os.environ['OMP_NUM_THREADS'])\n")
    result = launch("--world", world, "--log-dir", tmp_path / "logs", "--save_pid", "--bind_cores_to_rank", script)
    assert result.exit_code == 0, result.output
    assert f"launcher pid: {os.getpid()}" in result.output
    per_rank = len(CORES) // world
    assert rank_lines(tmp_path / "logs", world) == [
        f"True {CORES[r * per_rank:(r + 1) * per_rank]} {per_rank}" for r in range(world)]
    assert not Path(f"/tmp/{os.getpid()}.deepspeed").exists()


def test_save_pid_file_removed_on_sigterm(tmp_path):
    """DeepSpeed removes the file when SIGTERM reaches the launcher; so do we, after stopping
    the ranks. Here the rank itself signals its launcher (this process)."""
    script = tmp_path / "term.py"
    script.write_text("import os, signal, time\nprint(os.path.exists(f'/tmp/{os.getppid()}.deepspeed'), flush=True)\n"
                      "os.kill(os.getppid(), signal.SIGTERM)\ntime.sleep(60)\n")
    previous = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    result = launch("--world", "1", "--log-dir", tmp_path / "logs", "--save_pid", script)
    assert result.exit_code == 128 + signal.SIGTERM, result.output
    assert time.monotonic() - started < 30   # the rank was stopped, not waited for
    assert rank_lines(tmp_path / "logs", 1) == ["True"]
    assert not Path(f"/tmp/{os.getpid()}.deepspeed").exists()
    assert signal.getsignal(signal.SIGTERM) is previous


def _launch_signalled_at_fork(tmp_path: Path, nth: int):
    """In a fork of the test worker (the hook below stays registered for good): the launcher
    sends itself SIGTERM from inside its ``nth`` fork's at-fork hook, where Python cannot raise."""
    forks = []

    def at_fork():
        forks.append(os.getpid())
        if len(forks) == nth:
            os.kill(os.getpid(), signal.SIGTERM)

    os.register_at_fork(after_in_parent=at_fork)
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(60)\n")
    started = time.monotonic()
    result = launch("--world", "1", "--log-dir", tmp_path / "logs", "--save_pid", script)
    return result.exit_code, time.monotonic() - started, len(forks), result.output


@pytest.mark.parametrize("nth", [1, 2], ids=["rendezvous-keeper", "rank"])
def test_sigterm_during_a_fork_still_stops_the_launch(tmp_path, nth):
    """A SIGTERM that lands while the launcher forks its rendezvous keeper (the first fork) or a
    rank (the second) is held until the child is on record, then stops the launch: not printed
    as "Exception ignored" and lost while the launcher waits on its ranks."""
    code, seconds, forks, output = in_fork(_launch_signalled_at_fork, tmp_path, nth)
    assert forks >= nth, output
    assert code == 128 + signal.SIGTERM, output
    assert seconds < 30, output   # the rank was stopped, not waited for
    assert "ignored" not in output


def test_dry_run_shows_each_ranks_cores():
    result = launch("--include", f"localhost:{','.join(map(str, range(len(CORES))))}", "--bind_cores_to_rank",
                    "--dry-run", "train.py")
    assert result.exit_code == 0, result.output
    assert "--bind_cores_to_rank" in result.output and "cores" in result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip().startswith("localhost")]
    assert [row[-1] for row in rows] == [str(c) for c in CORES]   # one core each


def test_no_python_runs_the_program_itself(tmp_path):
    logs = tmp_path / "logs"
    result = launch("--include", "localhost:0,1", "--log-dir", logs, "--no_python", "echo", "x")
    assert result.exit_code == 0, result.output
    # DeepSpeed's launch.py puts --local_rank=N first, python or not.
    assert rank_lines(logs, 2) == ["--local_rank=0 x", "--local_rank=1 x"]
    result = launch("--world", "2", "--log-dir", logs, "--no_python", "sh", "-c", "echo $RANK/$WORLD_SIZE")
    assert result.exit_code == 0, result.output
    assert rank_lines(logs, 2) == ["0/2", "1/2"]


@pytest.mark.parametrize("args, words", [
    (["--world", "2", "--no_python", "-m", "json.tool"], "--no_python runs a program directly"),
    (["--world", "2", "--no_python", "no-such-program-here"], "not an executable file or a program on PATH"),
    (["--world", "2", "--no_python", "--backend", "gloo", "echo"], "drop --backend"),
    (["--world", "1", "--bind_core_list", "0", "x.py"], "add --bind_cores_to_rank"),
    (["--world", str(len(CORES) + 1), "--bind_cores_to_rank", "--dry-run", "x.py"], "each rank needs one"),
    (["--world", "1", "--bind_cores_to_rank", "--bind_core_list", "100000", "x.py"], "may not run on core(s) 100000"),
])
def test_refusals(tmp_path, args, words):
    from minitron.cli.common import UserError

    script = tmp_path / "x.py"
    script.write_text("")
    result = launch(*[str(script) if a == "x.py" else a for a in args])
    assert isinstance(result.exception, UserError), result.output
    assert words in str(result.exception) and "\n" not in str(result.exception)
    assert result.output == ""   # nothing printed, nothing started


def test_refusal_is_exit_2_from_the_command_line():
    done = subprocess.run([MINITRON, "launch", "--world", "2", "--no_python", "-m", "json.tool"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--no_python" in done.stderr
