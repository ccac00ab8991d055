"""The command line as a newcomer meets it: aliases, typos, --version, --help, Ctrl-C.

The typo rows of trace, launch's aliases, --version and Ctrl-C run the real `minitron` executable,
as a user would; the rest its entry point in this process (tests/cli_here.py), the same code
without a fresh interpreter's start-up.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cli_here import MINITRON, run_minitron

TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data"]


run = run_minitron  # the executable, or (here=True: answers that need no rank) its entry point


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minitron: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.mark.parametrize("argv, typo, suggestion", [
    (["trace", "--wrld", "16"], "--wrld", "--world"),                          # a typo in a required flag
    (["groups", "--wrld", "16"], "--wrld", "--world"),
    (["trace", "--world", "2", "--num-layer", "2"], "--num-layer", "--num-layers"),  # a Megatron flag
    (["pretrain", "--world", "2", "--tensor-model-paralel-size", "2"], "--tensor-model-paralel-size",
     "--tensor-model-parallel-size"),
    (["launch", "--wrld", "2", "x.py"], "--wrld", "--world"),
    (["vscode", "--wolrd", "2"], "--wolrd", "--world"),
])
def test_a_mistyped_flag_is_named_with_a_suggestion(argv, typo, suggestion):
    line = one_line_error(run(*argv, here=argv[0] != "trace"))  # trace's rows: the real executable
    assert f"no such option {typo}" in line and f"did you mean {suggestion}" in line
    assert "Missing option" not in line


def test_flags_after_the_script_belong_to_the_script(tmp_path, capfd):
    # In this process (the executable's launch is test_ctrl_c_stops_every_rank_and_says_so's):
    # the rank is forked from here, and what it prints goes to file descriptor 1, which capfd reads.
    script = tmp_path / "echo_args.py"
    script.write_text("import sys; print(' '.join(sys.argv[1:]))\n")
    proc = run("launch", "--world", "1", "--backend", "gloo", str(script), "--wrld", "--tp", "3", here=True)
    assert proc.returncode == 0, proc.stderr
    assert capfd.readouterr().out.strip() == "--wrld --tp 3"


def test_groups_takes_megatrons_long_flags_and_the_short_aliases():
    short = run("groups", "--world", "16", "--tp", "2", "--pp", "4", "--json", here=True)
    long = run("groups", "--world", "16", "--tensor-model-parallel-size", "2",
               "--pipeline-model-parallel-size", "4", "--json", here=True)
    assert short.returncode == long.returncode == 0, short.stderr + long.stderr
    assert json.loads(short.stdout) == json.loads(long.stdout)
    assert json.loads(short.stdout)["tp"][0] == [0, 1]


def test_groups_vp_shows_which_chunks_each_stage_holds():
    proc = run("groups", "--world", "4", "--pp", "4", "--vp", "2", here=True)
    assert proc.returncode == 0, proc.stderr
    assert "stage 0: chunks 0, 4" in proc.stdout and "stage 3: chunks 3, 7" in proc.stdout
    line = one_line_error(run("groups", "--world", "4", "--vp", "2", here=True))
    assert "needs pipeline-model-parallel size > 1" in line


@pytest.mark.parametrize("argv", [
    ["pretrain", "--world", "4", "--tp", "3", *TINY],
    ["pretrain", "--world", "4", "--tp=3", *TINY],
    ["launch", "--world", "4", "-m", "minitron.pretrain_gpt", "--tp", "3", *TINY],
])
def test_pretrain_reads_the_short_aliases_as_megatrons_flags(argv):
    # The alias reached validate_args as --tensor-model-parallel-size 3: 4 ranks are not a multiple.
    line = one_line_error(run(*argv, here=argv[0] == "pretrain"))
    assert "3" in line and "tensor" in line.lower()


def test_version():
    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("minitron ")
    assert proc.stdout.split()[1][0].isdigit()


def test_top_level_help_shows_each_commands_whole_first_sentence():
    proc = run("--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "Compute Megatron's process groups for a layout, without starting any process." in text
    assert "Run SCRIPT [ARGS...] (or -m MODULE [ARGS...]) on WORLD ranks, as torchrun would." in text
    assert "..." not in text.split("Commands:")[1].replace("[ARGS...]", "")  # click's truncation mark


def test_ctrl_c_stops_every_rank_and_says_so(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(
        "import os, pathlib, time\n"
        f"up = pathlib.Path({str(tmp_path)!r}, 'up' + os.environ['RANK'])\n"
        "up.with_suffix('.tmp').write_text(str(os.getpid()))\n"
        "up.with_suffix('.tmp').rename(up)  # appears whole: the test reads it at once\n"
        "time.sleep(120)\n")
    # A terminal's Ctrl-C reaches the launcher as SIGINT (a shell's background job ignores it,
    # so restore the default in the child).
    proc = subprocess.Popen([MINITRON, "launch", "--world", "2", "--backend", "gloo", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"up{r}").exists() for r in range(2)):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == "minitron: interrupted; every rank was stopped"
    for r in range(2):
        pid = int((tmp_path / f"up{r}").read_text())
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
