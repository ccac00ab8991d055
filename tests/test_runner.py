"""DeepSpeed's runner arithmetic (launcher/runner.py) and `minitron launch`'s DeepSpeed options.

The include/exclude values below are DeepSpeed 0.19.8's (test_ds_runner_peer.py runs its own
functions on some 200 cases; all agree). The one place minitron goes further: an --exclude that
leaves no slot, which DeepSpeed hands on as an empty world and then fails on with an IndexError,
is refused in one line by active_resources.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest

from minitron.launcher.runner import (
    ResourceError, _parse_hostfile, active_resources, decode_world_info, encode_world_info, node_rank_env,
    parse_inclusion_exclusion,
)

from cli_here import run_minitron

POOL = OrderedDict([("worker-0", 4), ("worker-1", 2), ("worker-2", 4)])


@pytest.mark.parametrize("include, exclude, expected", [
    ("", "", {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1], "worker-2": [0, 1, 2, 3]}),
    ("worker-1:0", "", {"worker-1": [0]}),
    ("worker-0:3,1", "", {"worker-0": [1, 3]}),                       # slots sorted, as DeepSpeed does
    ("worker-2:0@worker-0:2", "", {"worker-0": [2], "worker-2": [0]}),  # hostfile order, not the filter's
    ("worker-0:1@worker-0:2", "", {"worker-0": [1, 2]}),
    ("", "worker-1", {"worker-0": [0, 1, 2, 3], "worker-2": [0, 1, 2, 3]}),
    ("", "worker-0:0,0@worker-2:1", {"worker-0": [1, 2, 3], "worker-1": [0, 1], "worker-2": [0, 2, 3]}),
    ("worker-0", "", {"worker-0": [0, 1, 2, 3]}),  # a whole host: all its slots
    ("", "worker-0@worker-1@worker-2", {}),        # nothing left: DeepSpeed's result too (see above)
])
def test_inclusion_exclusion_as_deepspeed(include, exclude, expected):
    assert dict(parse_inclusion_exclusion(POOL, include, exclude)) == expected


@pytest.mark.parametrize("include, exclude, message", [
    ("worker-9", "", "not in the hostfile"), ("worker-1:5", "", "no slot 5"), ("", "worker-1:5", "no slot 5"),
    ("worker-0", "worker-1", "mutually exclusive"), ("worker-0:x", "", "slots are numbers"),
    ("worker-0:", "", "no slots after ':'"), ("", "worker-0:", "no slots after ':'"),
])
def test_bad_filters_are_one_line(include, exclude, message):
    with pytest.raises(ResourceError, match=message):
        parse_inclusion_exclusion(POOL, include, exclude)


def test_hostfile_format():
    assert _parse_hostfile(["# two hosts", "", "w0 slots=4", "w1 slots=2 # trailing words are ignored"]) == \
        OrderedDict(w0=4, w1=2)
    for bad in (["w0"], [], ["w0 slots=4", "w0 slots=2"]):
        with pytest.raises(ResourceError):
            _parse_hostfile(bad)


def test_world_info_round_trip_is_deepspeeds_encoding():
    info = OrderedDict([("worker-0", [0, 1, 2, 3]), ("worker-1", [0, 1])])
    encoded = encode_world_info(info)
    assert encoded == "eyJ3b3JrZXItMCI6IFswLCAxLCAyLCAzXSwgIndvcmtlci0xIjogWzAsIDFdfQ=="  # DeepSpeed's output
    assert decode_world_info(encoded) == info


def test_launch_py_environment_and_its_local_rank_rule():
    info = OrderedDict([("worker-0", [0, 1]), ("worker-1", [0, 1, 2, 3])])
    second = node_rank_env(info, 1, "worker-0", 29500)
    assert [e["RANK"] for e in second] == ["2", "3", "4", "5"]
    # rank % LOCAL_SIZE: not the process's index on worker-1 (that would be 0, 1, 2, 3).
    assert [e["LOCAL_RANK"] for e in second] == ["2", "3", "0", "1"]
    assert {(e["WORLD_SIZE"], e["CROSS_RANK"], e["CROSS_SIZE"], e["LOCAL_SIZE"], e["CUDA_VISIBLE_DEVICES"])
            for e in second} == {("6", "1", "2", "4", "0,1,2,3")}


def test_num_nodes_and_num_gpus(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=4\nb slots=4\nc slots=4\n")
    assert list(active_resources(hosts, 1, num_nodes=2)) == ["a", "b"]
    assert dict(active_resources(hosts, 1, num_gpus=2)) == {"a": [0, 1], "b": [0, 1], "c": [0, 1]}
    with pytest.raises(ResourceError, match="cannot be combined"):
        active_resources(hosts, 1, include="a", num_gpus=2)
    with pytest.raises(ResourceError, match="needs a hostfile"):
        active_resources(None, 4, num_nodes=2)


# The launches below run `minitron`'s entry point in this process (cli_here.minitron_here), not
# a fresh interpreter that imports torch again (~1 s of CPU each): the forked ranks write to the
# real descriptor 1, as they would to a terminal, and pytest's capfd reads what they wrote.

def _launch_here(capfd, *argv, cwd=None):
    """``minitron launch ARGV`` in this process: the result, and what the ranks printed."""
    capfd.readouterr()
    done = run_minitron("launch", *argv, cwd=cwd, here=True)
    return done, capfd.readouterr().out


def test_launch_dry_run_and_a_local_include(tmp_path, capfd):
    hosts = tmp_path / "hosts"
    hosts.write_text("worker-0 slots=2\nworker-1 slots=4\n")
    dry = run_minitron("launch", "--hostfile", str(hosts), "--dry-run", "train.py", "--lr", "1", here=True)
    assert dry.returncode == 0, dry.stderr
    command = " ".join(dry.stdout.replace("\\\n", " ").split())  # the command is printed over lines
    assert "pdsh -S -f 1024 -w worker-0,worker-1 python -u -m deepspeed.launcher.launch --world_info=$WORLD_INFO" \
        in command
    info = encode_world_info(OrderedDict([("worker-0", [0, 1]), ("worker-1", [0, 1, 2, 3])]))
    assert f"\n  {info}\n" in dry.stdout
    assert "--node_rank=%n --master_addr=worker-0 --master_port=29500 train.py --lr 1" in command
    refused = run_minitron("launch", "--hostfile", str(hosts), "docs/examples/launch_demo.py",
                           cwd=Path(__file__).parent.parent, here=True)
    assert refused.returncode == 2 and "spans worker-0, worker-1" in refused.stderr
    script = tmp_path / "show.py"
    script.write_text("import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['LOCAL_SIZE'])\n")
    run, printed = _launch_here(capfd, "--include", "localhost:0,1", "--backend", "gloo", str(script))
    assert run.returncode == 0, run.stderr
    assert sorted(printed.split("\n")[:2]) == ["0 2 2", "1 2 2"]


def test_deepspeed_style_launch_passes_local_rank_unless_told_not_to(tmp_path, capfd):
    script = tmp_path / "args.py"
    script.write_text("import os, sys; print(os.environ['RANK'], os.environ['CROSS_SIZE'], *sys.argv[1:])\n")

    def lines(*flags):
        proc, printed = _launch_here(capfd, *flags, "--backend", "gloo", str(script), "x")
        assert proc.returncode == 0, proc.stderr
        return sorted(printed.splitlines())

    passed = lines("--include", "localhost:0,1")
    left_out = lines("--include", "localhost:0,1", "--no_local_rank")
    assert passed == ["0 1 --local_rank=0 x", "1 1 --local_rank=1 x"]
    # --no_local_rank, and torchrun's way (--world), add nothing: tests/test_cli_flags.py runs the latter.
    assert left_out == ["0 1 x", "1 1 x"]


def test_an_exclude_that_leaves_nothing_is_refused(tmp_path):
    """DeepSpeed 0.19.8 hands the empty world on and fails later (an IndexError); here one line."""
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=2\nb slots=1\n")
    with pytest.raises(ResourceError, match="left no slot to run on"):
        active_resources(hosts, 1, exclude="a@b:0")
