"""ZeRO-Infinity's parameter swapping (offload_param device "nvme": swap_tensor/partitioned_param_swapper.py,
zero/param_swap.py) on two gloo ranks, one traced run shared by the tests:

* the swapped pieces are the same bytes as offload_param "cpu"'s host pieces, read back as they
  were written: losses and final weights are bit-equal to "cpu", alone and with the optimizer's
  states swapped too;
* max_in_cpu as DeepSpeed reads it: at its default (1e9 elements) nothing goes to a file; at 0
  every sub-group does, and in it each piece over the 1 MiB floor gets its own file, padded to
  1 KiB, named by ds_id under zero_stage_3/float32params/rank{R};
* the trace: one swap_in before each gather of the swapped weight (forward and backward), one
  swap_out at the start and one per step, each with its bytes; those bytes leave host memory.
DeepSpeed's own swapper is not run as a peer: it needs its async I/O op (libaio), which the
peer's CPU install does not build.
"""

import importlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from minitron.runtime.swap_tensor.aio_config import AioConfig
from minitron.runtime.swap_tensor.partitioned_param_swapper import AsyncPartitionedParameterSwapper
from minitron.runtime.zero.sub_groups import in_memory_sub_groups

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
show = importlib.import_module("show_param_swap")   # the cases, model and run chapter 14c shows
PIECE = 512 * 1024 // 2 * 4   # the 512 x 1024 weight (ds_id 4): each rank's piece, fp32, exactly 1 MiB
STEPS = show.STEPS


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("param_swap")
    results, records = show.run(str(root))
    return results, records, root


def _calls(records, window, kind: str) -> list:
    return [r["args"] for r in records if r["name"].endswith(kind) and window[0] <= r["start_us"] <= window[1]]


@pytest.mark.parametrize("name", ["nvme", "nvme_default", "both_nvme"])
def test_swapping_parameters_changes_no_number(runs, name):
    results = runs[0]
    for rank in (0, 1):
        ours, cpu = results[rank][name], results[rank]["cpu"]
        assert ours["losses"] == cpu["losses"]
        assert all(torch.equal(a, b) for a, b in zip(ours["weights"], cpu["weights"]))


def test_files_as_deepspeed_lays_them_out(runs):
    results, _, root = runs
    folder = root / "nvme" / "nvme" / "zero_stage_3" / "float32params"
    assert sorted(os.listdir(folder)) == ["rank0", "rank1"]
    assert {f: os.path.getsize(folder / "rank1" / f) for f in os.listdir(folder / "rank1")} == \
        {"4_param.tensor.swp": PIECE}
    assert results[0]["nvme"]["nvme"] == {"params": PIECE}
    # max_in_cpu's default keeps every sub-group in host memory: the folder is made, and empty
    assert os.listdir(root / "nvme" / "nvme_default" / "zero_stage_3" / "float32params" / "rank0") == []
    assert results[0]["nvme_default"]["nvme"] == {"params": 0}


def test_trace_shows_each_swap_with_its_bytes(runs):
    results, records, _ = runs
    window = results[0]["nvme"]["window"]
    swap_in = _calls(records, window, "swap_in")
    assert swap_in == [{"params": 1, "bytes": PIECE}] * (2 * STEPS)   # forward's gather and backward's
    assert _calls(records, window, "AsyncPartitionedParameterSwapper.swap_out") == \
        [{"params": 1, "bytes": PIECE}] * STEPS
    # what is in the file is not in host memory
    assert results[0]["cpu"]["host"]["params"] - results[0]["nvme"]["host"]["params"] == PIECE
    assert results[0]["nvme_default"]["host"] == results[0]["cpu"]["host"]


def test_max_in_cpu_counts_elements_as_deepspeed():
    """DeepSpeed's _create_param_groups_fp16_flat_cpu_memory: group by group, what still fits."""
    assert in_memory_sub_groups([[3, 3], [4]], 10) == [True, True, True]
    assert in_memory_sub_groups([[3, 3], [4]], 5) == [True, False, False]
    assert in_memory_sub_groups([[3, 3], [4]], 0) == [False, False, False]
    assert in_memory_sub_groups([[6], [1]], 6) == [True, True]   # DeepSpeed's one-element "no room" buffer


def test_buffers_refuse_what_they_cannot_hold(tmp_path):
    config = SimpleNamespace(nvme_path=str(tmp_path), buffer_count=1, buffer_size=300_000)
    swapper = AsyncPartitionedParameterSwapper(config, AioConfig(), torch.float32, 0)
    ps = [SimpleNamespace(ds_id=k, ds_shape=(262_144,), ds_tensor=torch.full((262_144,), float(k)))
          for k in range(2)]
    assert swapper.swappable(262_144) and not swapper.swappable(262_143)
    swapper.swap_out(ps, [p.ds_tensor for p in ps])
    for p in ps:
        p.ds_tensor = torch.empty(262_144, device="meta")
    swapper.swap_in(ps[:1])
    assert torch.equal(ps[0].ds_tensor, torch.zeros(262_144))
    with pytest.raises(RuntimeError, match="buffer_count 1"):
        swapper.swap_in(ps[1:])
    swapper.release(ps[:1])
    assert ps[0].ds_tensor.is_meta
    big = SimpleNamespace(ds_id=9, ds_shape=(300_001,))
    with pytest.raises(RuntimeError, match="buffer_size 300000"):
        swapper.swap_out([big], [torch.zeros(300_001)])


def test_the_chapters_table_is_this_run(runs):
    """docs/examples/param_swap.json (scripts/show_param_swap.py --write; chapter 14c): the same
    bytes, files and swap calls as this run (the losses are left out: another CPU's kernels may
    round them otherwise; that they are equal across the cases is the test above)."""
    import json
    ours = show.summary(*runs)
    theirs = json.loads(show.JSON.read_text())
    drop = lambda d: {name: {k: v for k, v in case.items() if k != "losses"} for name, case in d.items()}  # noqa: E731
    assert drop(ours) == drop(theirs)


def test_estimate_names_the_bytes_in_files(tmp_path, monkeypatch, capsys):
    """theoretical_offload.py, for chapter 14c's GPT (the word embedding, 8,320 padded rows x 64,
    is the one piece over the floor): with max_in_cpu 0 its piece is in a file, read at each of
    its 3 gathers a micro-batch (forward, backward, the tied output layer) x 2 micro-batches and
    written once; with the default it is host memory, as with "cpu". (The same numbers as a traced
    pretrain's swap_in/swap_out, checked when this was written: 6 reads, 1 write a step.)"""
    import json

    from minitron.cli import main
    piece = 8320 * 64 // 2 * 4
    model = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--micro-batch-size", "1", "--global-batch-size", "4", "--vocab-size", "8192"]
    config = json.loads((ROOT / "docs" / "examples" / "ds_config_param_nvme.json").read_text())
    got = {}
    for name, max_in_cpu in (("nvme", 0), ("default", 1_000_000_000)):
        config["zero_optimization"]["offload_param"]["max_in_cpu"] = max_in_cpu
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(config))
        monkeypatch.setattr(sys, "argv", ["minitron", "estimate", "--world", "2", *model, "--deepspeed",
                                          "--deepspeed-config", str(path), "--json"])
        with pytest.raises(SystemExit) as done:
            main()
        assert done.value.code == 0
        [got[name]] = json.loads(capsys.readouterr().out)["offload"]
    assert (got["nvme"]["nvme"], got["nvme"]["nvme read"], got["nvme"]["nvme write"]) == (piece, 6 * piece, piece)
    assert got["default"]["host"] - got["nvme"]["host"] == piece and got["default"]["nvme"] == 0
    assert {k: v for k, v in got["nvme"].items() if "nvme" not in k and k != "host"} == \
        {k: v for k, v in got["default"].items() if "nvme" not in k and k != "host"}
