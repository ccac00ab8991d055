"""Chapter 12b's table comes from a committed JSON (docs/sharding-runs/compare.json) that
scripts/compare_sharding.py wrote from ~10 traced 8-rank runs, too slow for every build. Here:

* the committed file is the script's: its configurations, model and world; the checks the script
  runs (losses = the serial run's, bytes and collectives = the estimate's) pass on it; and its
  figures are what sharding promises, to the byte (Megatron-FSDP's with the padding its unit
  layout adds, fsdp/buffer_index.py);
* one row, rerun now through the script's own code (the distributed optimizer, 8 ranks, one
  iteration), holds what the file says: the same bytes at rest, the same collectives in its
  iteration, and the same first loss;
* the chapter's picture is what the script draws from the file.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import pytest

from distributed import in_fork

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
compare = importlib.import_module("compare_sharding")
view = importlib.import_module("compare_sharding_view")
COMMITTED = json.loads(compare.JSON.read_text())
ROWS = {row["name"]: row for row in COMMITTED["configs"]}
RERUN = "distributed optimizer"


def rank0(name: str, when: str = "step") -> dict:
    return ROWS[name]["ranks"][0][when]


def test_committed_file_is_the_scripts_runs():
    assert list(ROWS) == list(compare.CONFIGS)
    assert COMMITTED["model"] == compare.MODEL and COMMITTED["world"] == compare.WORLD == 8
    assert COMMITTED["iters"] == compare.ITERS and COMMITTED["produced"]["commit"]
    assert view.check(COMMITTED) == []
    assert all(len(row["losses"]) == COMMITTED["iters"] for row in ROWS.values())


def fsdp_units() -> list[list[tuple]]:
    """The shapes in each of Megatron-FSDP's optim_grads_params units of compare.MODEL: one unit
    per layer (qkv, proj, fc1, fc2, their biases, two layernorms) and "the rest" (both
    embeddings, the final norm, the untied output layer). Written from the GPT's structure, not
    from the estimate. The other strategies have no unit modules: the model is one unit."""
    flag = dict(zip(compare.MODEL, compare.MODEL[1:]))
    h, seq, layers = int(flag["--hidden-size"]), int(flag["--seq-length"]), int(flag["--num-layers"])
    vocab = -(-int(flag["--vocab-size"]) // 128) * 128   # padded as Megatron pads it (1023 -> 1024)
    layer = [(h,), (h,), (3 * h, h), (3 * h,), (h, h), (h,), (h,), (h,), (4 * h, h), (4 * h,), (h, 4 * h), (h,)]
    return [layer] * layers + [[(vocab, h), (seq, h), (h,), (h,), (vocab, h)]]


def test_committed_figures_are_what_sharding_promises():
    from minitron.core.distributed.fsdp.buffer_index import build_buffer_index

    n, dp = ROWS["DDP"]["ranks"][0]["numel"], COMMITTED["world"]
    ddp = rank0("DDP")
    # fp32 everywhere: Megatron steps the model's own fp32 weights (Adam's two moments only);
    # DeepSpeed keeps an fp32 master copy even then (three fp32 numbers per parameter).
    assert ddp == {"params": 4 * n, "grads": 4 * n, "optimizer": 8 * n}
    # Megatron-FSDP pads each unit to a multiple of dp x its chunk (its widest row: fc2's 256 in
    # a layer and in the whole model, 64 in the rest). optim_grads_params: 49,984 -> 51,200
    # elements a layer (1,216 of padding), 133,248 -> 133,632 the rest (384), 338,432 in all, a
    # shard 42,304. optim and optim_grads, one unit in the module's order: 333,184 -> 333,824
    # (640), a shard 41,728. Buffers are that size on every rank, and the padding ends each unit,
    # so rank 0's shard is all real.
    units = fsdp_units()
    index = [build_buffer_index(shapes, dp) for shapes in units]
    pad = [i.size - sum(math.prod(s) for s in shapes) for i, shapes in zip(index, units)]
    assert pad == [1216] * 4 + [384]
    padded, shard = sum(i.size for i in index), sum(i.shard_size for i in index)
    assert (padded, shard) == (n + sum(pad), (n + sum(pad)) // dp) == (338_432, 42_304)
    single = build_buffer_index(units[-1][:2] + [s for layer in units[:-1] for s in layer] + units[-1][2:], dp)
    assert (single.size, single.shard_size) == (n + 640, (n + 640) // dp) == (333_824, 41_728)
    layouts = {"FSDP optim": (single.size, single.shard_size, 640),
               "FSDP optim_grads": (single.size, single.shard_size, 640),
               "FSDP optim_grads_params": (padded, shard, sum(pad))}
    # Elsewhere, what each shards is 1/dp of the whole up to the padding that makes equal
    # partitions (at most 2 x dp elements a flat buffer, one element a ZeRO-3 parameter).
    slack = 4 * 2 * dp * 16
    for name, sharded, whole in [
            ("distributed optimizer", {"optimizer": 8}, {"params": 4, "grads": 4}),
            ("ZeRO-1", {"optimizer": 12}, {"params": 4, "grads": 4}),
            ("ZeRO-2", {"optimizer": 12, "grads": 4}, {"params": 4}),
            ("ZeRO-3", {"optimizer": 12, "grads": 4, "params": 4}, {}),
            ("FSDP2", {"optimizer": 8, "grads": 4, "params": 4}, {})]:
        held = rank0(name)
        for kind, per in sharded.items():
            assert 0 <= held[kind] - per * n / dp <= slack, (name, kind, held[kind])
        for kind, per in whole.items():
            assert 0 <= held[kind] - per * n <= slack, (name, kind, held[kind])
    for name, sharded, whole in [
            ("FSDP optim", {"optimizer": 8}, {"params": 4, "grads": 4}),
            ("FSDP optim_grads", {"optimizer": 8, "grads": 4}, {"params": 4}),
            ("FSDP optim_grads_params", {"optimizer": 8, "grads": 4, "params": 4}, {})]:
        size, piece, padding = layouts[name]
        assert rank0(name) == {**{k: per * piece for k, per in sharded.items()},
                               **{k: per * size for k, per in whole.items()}}, name
        # The last rank's shard holds the padding, and Adam keeps state for real elements only.
        assert ROWS[name]["ranks"][-1]["step"]["optimizer"] == 8 * (piece - padding), name
    # optim_grads_params at its peak: its shards, and the rest unit and one layer gathered whole.
    assert ROWS["FSDP optim_grads_params"]["ranks"][0]["peak_params"] == 4 * (shard + index[-1].size + index[0].size)
    # Parameters sharded: the peak holds the gathered units/modules on top of the step's bytes.
    for name in ("FSDP optim_grads_params", "ZeRO-3", "FSDP2"):
        peak = sum(ROWS[name]["ranks"][0]["peak"].values())
        assert peak > sum(rank0(name).values()), name
    # DDP's gradient all-reduce hands the whole gradient (plus 8 bytes: the loss's all-reduce).
    hands = {c["kind"]: c["bytes"] for c in ROWS["DDP"]["collectives"] if c["group"] == "dp-cp"}
    assert hands == {"all_reduce": 4 * n + 8}


@pytest.fixture(scope="module")
def rerun(tmp_path_factory):
    """The script's own run (its `run` command, as the file's rows were made), in a forked copy of
    this worker: its launches patch the modules of the process they run in while they run, and a
    forked rank of a later test in this worker must not find anything of them."""
    out = tmp_path_factory.mktemp("rerun") / "row.json"
    code = in_fork(compare.main, ["run", "--only", RERUN, "--world", str(compare.WORLD), "--iters", "1",
                                 "--no-serial", "--out", str(out)])
    assert code == 0
    return json.loads(out.read_text())


def test_one_row_rerun_holds_what_the_file_says(rerun):
    assert view.check(rerun) == []   # bytes and collectives = the estimate's, every rank alike
    now, then = rerun["configs"][0], ROWS[RERUN]
    assert [r["rest"] for r in now["ranks"]] == [r["rest"] for r in then["ranks"]]
    assert now["collectives"] == then["collectives"]
    # The first iteration's loss: one step fewer is the same computation (tolerance: the same
    # sums on the same machine may run in another thread order).
    assert now["losses"][0] == pytest.approx(then["losses"][0], abs=1e-6)


def test_chapter_figure_is_what_the_script_draws():
    """Rewrite it with `python scripts/compare_sharding.py svg walkthrough/figures/12b-sharding-compared.svg`."""
    from test_svg import parse   # well-formed, and every label inside the picture

    drawn = (ROOT / "walkthrough/figures/12b-sharding-compared.svg").read_text()
    assert drawn == view.figure(COMMITTED)
    parse(drawn)
