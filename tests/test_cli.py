"""The `minitron` command line as a user meets it: the executable for a row of each table, its
entry point in this process (tests/cli_here.py) for the rest.

(a) `groups --json` prints Megatron's layout (checked against tests/megatron_reference.py);
(b) bad input is one line on stderr, a non-zero exit, and no rank started;
(d) a failing rank under `minitron launch` is named with its log, and nothing is left behind.
The 16-rank trace is in test_trace16.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _rank_probe import leftovers
from cli_here import minitron_here, run_minitron
from megatron_reference import DEFAULT_ORDER, KINDS, TP_PP_DP_ORDER, reference_layout

PROBE = str(Path(__file__).parent / "_rank_probe.py")


# The tables below send their first row through the executable and the rest through the entry
# point in this process (here=True), which answers in ~20 ms instead of ~0.5 s.
run = run_minitron


# (a) groups --json ----------------------------------------------------------------------
GROUP_LAYOUTS = [
    (1, 1, 1, 1, 1, DEFAULT_ORDER), (8, 2, 2, 1, 1, DEFAULT_ORDER), (16, 2, 4, 1, 1, DEFAULT_ORDER),
    (16, 2, 4, 1, 1, TP_PP_DP_ORDER), (8, 4, 1, 2, 1, DEFAULT_ORDER), (16, 2, 2, 2, 2, DEFAULT_ORDER),
    (32, 2, 2, 2, 4, DEFAULT_ORDER), (16, 2, 2, 2, 2, TP_PP_DP_ORDER), (64, 4, 2, 1, 8, DEFAULT_ORDER),
    (32, 1, 8, 1, 1, TP_PP_DP_ORDER), (24, 2, 4, 1, 1, DEFAULT_ORDER),
]


@pytest.fixture(scope="module")
def groups_outputs():
    def one(i, case):
        world, tp, pp, cp, ep, order = case
        return run("groups", "--world", str(world), "--tp", str(tp), "--pp", str(pp), "--cp", str(cp),
                   "--ep", str(ep), "--order", order, "--json", here=i > 0)

    return {case: one(i, case) for i, case in enumerate(GROUP_LAYOUTS)}


@pytest.mark.parametrize("case", GROUP_LAYOUTS, ids=lambda c: "w{}-tp{}-pp{}-cp{}-ep{}-{}".format(*c))
def test_groups_json_is_megatrons_layout(groups_outputs, case):
    proc = groups_outputs[case]
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    got = json.loads(proc.stdout)  # exactly one JSON document on stdout
    assert set(got) == set(KINDS)
    ref = reference_layout(*case)
    for kind in KINDS:
        assert got[kind] == ref[kind], kind


# (b) bad input --------------------------------------------------------------------------
def _gpus() -> int:
    import torch
    return torch.cuda.device_count()


# (name, argv): every one must fail before any rank starts. OUT is replaced by a fresh path.
BAD = [
    ("world-not-divisible", ["trace", "--world", "6", "--tp", "4", "--out", "OUT"]),
    ("global-batch", ["trace", "--world", "8", "--tp", "2", "--out", "OUT", "--",
                      "--global-batch-size", "3", "--micro-batch-size", "2"]),
    ("layers-pp", ["trace", "--world", "4", "--pp", "4", "--out", "OUT", "--", "--num-layers", "6"]),
    ("layers-pp-vp", ["trace", "--world", "4", "--pp", "2", "--vp", "2", "--out", "OUT", "--",
                      "--num-layers", "6"]),
    ("heads-tp", ["trace", "--world", "4", "--tp", "4", "--out", "OUT", "--", "--num-attention-heads", "6"]),
    ("ep-expert-dp", ["trace", "--world", "8", "--tp", "2", "--ep", "3", "--out", "OUT"]),
    ("fp16-bf16", ["trace", "--world", "2", "--out", "OUT", "--", "--fp16", "--bf16"]),
    ("world-zero", ["trace", "--world", "0", "--out", "OUT"]),
    ("order-token", ["trace", "--world", "8", "--order", "tp-cp-ep-xx-pp", "--out", "OUT"]),
    ("nccl-without-gpu", ["trace", "--world", "2", "--backend", "nccl", "--out", "OUT"]),
    # The same mistakes elsewhere, and plain usage errors (these never import torch: cheap).
    ("groups-world-negative", ["groups", "--world", "-2", "--json"]),
    ("groups-order-token", ["groups", "--world", "8", "--order", "tp-cp-xx-dp-pp", "--json"]),
    ("groups-unknown-flag", ["groups", "--world", "8", "--bogus"]),
    ("trace-missing-world", ["trace", "--out", "OUT"]),
    ("launch-world-zero", ["launch", "--world", "0", PROBE, "OUT"]),
]


@pytest.fixture(scope="module")
def bad_outputs(tmp_path_factory):
    """Run every bad command once (the first through the real executable, see run)."""
    root = tmp_path_factory.mktemp("bad")

    def one(i, item):
        name, argv = item
        out = root / name
        return name, (out, run(*[str(out) if a == "OUT" else a for a in argv], here=i > 0))

    cases = [c for c in BAD if not (c[0].endswith("nccl-without-gpu") and _gpus() >= 2)]
    return dict(one(i, case) for i, case in enumerate(cases))


@pytest.mark.parametrize("name", [name for name, _ in BAD])
def test_bad_input_is_one_line_and_starts_nothing(bad_outputs, name):
    if name not in bad_outputs:
        pytest.skip("this machine has GPUs: nccl is not bad input here")
    out, proc = bad_outputs[name]
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got {len(lines)}:\n{proc.stderr}"
    assert lines[0].startswith("minitron: error:"), lines[0]
    # Nothing ran: no trace directory, no log directory, no rank record from the probe script.
    assert not out.exists()


def test_bad_input_messages_say_what_is_wrong(bad_outputs):
    """Spot checks that the one line names the numbers involved, so the user can fix them."""
    msg = {name: proc.stderr for name, (_, proc) in bad_outputs.items()}
    assert "6" in msg["world-not-divisible"] and "4" in msg["world-not-divisible"]
    assert "3" in msg["global-batch"] and "8" in msg["global-batch"]       # 3 vs micro 2 x dp 4
    assert "6" in msg["layers-pp"] and "4" in msg["layers-pp"]
    assert "6" in msg["heads-tp"] and "4" in msg["heads-tp"]
    assert "fp16" in msg["fp16-bf16"] and "bf16" in msg["fp16-bf16"]
    assert "xx" in msg["order-token"] or "tp-cp-ep-xx-pp" in msg["order-token"]
    assert "--world" in msg["world-zero"] and "world" in msg["trace-missing-world"]
    assert "--bogus" in msg["groups-unknown-flag"]


def test_no_arguments_shows_help_without_a_traceback():
    proc = run()
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "groups" in proc.stdout + proc.stderr and "trace" in proc.stdout + proc.stderr


def test_the_entry_point_leaves_the_callers_collector_as_it_found_it():
    import gc

    # main() runs its command with the cyclic collector off (cli/__init__.py says why); called
    # in a process that goes on afterwards, it must hand the collector back in either state.
    for collecting in (True, False):
        (gc.enable if collecting else gc.disable)()
        try:
            assert minitron_here("groups", "--world", "4", "--tp", "2").returncode == 0
            assert minitron_here("groups", "--world", "3", "--tp", "2").returncode == 2
            assert gc.isenabled() is collecting
        finally:
            gc.enable()


def test_a_trace_into_a_used_directory_keeps_nothing_of_the_previous_run(tmp_path):
    import os

    from minitron.cli.trace_out import clear_previous_run

    for name in ("rank0.jsonl", "rank1.jsonl", "rank2.jsonl", "rank7.jsonl", "trace.json"):
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "elsewhere.jsonl").write_text("kept\n")
    os.symlink(tmp_path / "elsewhere.jsonl", tmp_path / "rank3.jsonl")
    inode = (tmp_path / "rank1.jsonl").stat().st_ino
    clear_previous_run(tmp_path, range(4))   # this run writes ranks 0..3
    left = sorted(p.name for p in tmp_path.iterdir())
    # Its ranks' files emptied in place (same inode), the rest gone; a link is removed, never
    # followed: what it points at is not the trace's.
    assert left == ["elsewhere.jsonl", "rank0.jsonl", "rank1.jsonl", "rank2.jsonl"]
    assert all((tmp_path / f"rank{r}.jsonl").stat().st_size == 0 for r in range(3))
    assert (tmp_path / "rank1.jsonl").stat().st_ino == inode
    assert (tmp_path / "elsewhere.jsonl").read_text() == "kept\n"


# (d) a failing rank under `minitron launch` ---------------------------------------------

def test_the_directory_is_cleared_meanwhile_and_a_failure_is_one_line(tmp_path, capfd):
    """clear_meanwhile clears in a forked child (while the command imports torch); the wait
    raises a UserError when the child could not, after its one line on stderr."""
    from minitron.cli.common import UserError
    from minitron.cli.trace_out import clear_meanwhile

    (tmp_path / "rank0.jsonl").write_text("{}\n")
    (tmp_path / "trace.json").write_text("{}")
    clear_meanwhile(tmp_path, range(1))()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.jsonl"] and (tmp_path / "rank0.jsonl").stat().st_size == 0
    (tmp_path / "rank5.jsonl").mkdir()   # not this run's rank: to be removed, and a directory cannot be unlinked
    with pytest.raises(UserError, match="could not be cleared"):
        clear_meanwhile(tmp_path, range(1))()
    assert capfd.readouterr().err.count("\n") == 1

def test_launch_names_the_failing_rank_and_leaves_nothing(tmp_path):
    # The entry point in this process, its ranks forked from here (torch loaded): the one line
    # is main()'s; `launch` as an executable is held by test_cli_flags' Ctrl-C test.
    logs = tmp_path / "logs"
    proc = run("launch", "--world", "4", "--log-dir", str(logs), PROBE, str(tmp_path), "raise", here=True)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr.splitlines()[0]
    first = proc.stderr.splitlines()[0]
    assert "rank 2" in first and str(logs / "rank2.log") in proc.stderr.replace("\n", "")
    assert "ValueError: rank 2 fails on purpose" in (logs / "rank2.log").read_text()
    assert leftovers(tmp_path, 4) == []
    assert not list(tmp_path.glob("finished*"))
