"""--ckpt-format fsdp_dtensor: Megatron-FSDP saves its shards by parameter and resumes at
another data-parallel size and sharding strategy, continuing the uninterrupted run.

Saved at dp 2 with optim_grads_params (Megatron's default) at iteration 2 of 4; resumed there
at dp 4 with optim_grads and at dp 1 (no_shard), each giving iterations 3 and 4 of the
uninterrupted run's losses (rel 1e-5: only the order of the sums differs, as test_fsdp.py; the
dp 1 resume is a stress case). The stored tensors have the model's shapes under Megatron's keys,
the flat-range-to-rectangles cut covers every element once, and chapter 18's committed runs
(docs/fsdp-runs/fsdp_dtensor.json, scripts/fsdp_dtensor_runs.py, same flags) are this run's.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from distributed import pretrain_records
from minitron.cli.common import UserError, validate_pretrain
from minitron.training.checkpoint_files import TRACKER, iteration_dir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
runs = importlib.import_module("fsdp_dtensor_runs")   # chapter 18's committed runs, made from these flags
COMMITTED = json.loads(runs.JSON.read_text())
MODEL = [flag for flag in runs.MODEL if flag not in ("--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor")]


def _losses(records):
    return [r["lm_loss"] for r in records]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The uninterrupted run (dp 2, optim_grads_params, 4 iterations), which saves at 2 and 4;
    the resumes start from iteration 2's checkpoint (the marker moved back to it)."""
    tmp = tmp_path_factory.mktemp("fsdp_ckpt")
    world, strategy = runs.FIRST
    run = pretrain_records(tmp / "first", world, [*runs.MODEL, "--data-parallel-sharding-strategy", strategy,
                                                  "--save-interval", "2", "--save", str(tmp / "ck")])
    (tmp / "ck" / TRACKER).write_text("2")
    return tmp, run


def test_chapter_18s_committed_runs_are_these(saved):
    """docs/fsdp-runs/fsdp_dtensor.json (scripts/fsdp_dtensor_runs.py) holds this checkpoint's
    layout, chunk for chunk, and this run's losses (the same flags on the same kind of ranks:
    to 1e-6, the sums' order being the same)."""
    tmp, run = saved
    assert runs.layout(iteration_dir(tmp / "ck", 2)) == COMMITTED["layout"]
    assert [r["lm_loss"] for r in run] == pytest.approx(COMMITTED["uninterrupted"], rel=1e-6)
    for resumed in COMMITTED["resumed"]:   # the committed resumes continue the committed run
        assert resumed["iterations"] == [3, 4]
        assert resumed["losses"] == pytest.approx(COMMITTED["uninterrupted"][2:], rel=1e-5)


def test_saved_by_parameter_under_megatrons_keys(saved):
    tmp, _ = saved
    where = iteration_dir(tmp / "ck", 2)
    assert json.loads((where / "metadata.json").read_text())["sharded_backend"] == "fsdp_dtensor"
    from minitron.core.dist_checkpointing.serialization import read_dcp_metadata
    stored = read_dcp_metadata(where).state_dict_metadata
    qkv = "decoder.layers.1.self_attention.linear_qkv.weight"
    assert tuple(stored[f"model.module.{qkv}"].size) == (96, 32)      # the parameter's own shape
    assert tuple(stored[f"optimizer.state.module.{qkv}.exp_avg_sq"].size) == (96, 32)
    assert tuple(stored["model.module.embedding.word_embeddings.weight"].size) == (1024, 32)
    # SwiGLU's fc1 as Megatron keeps it: gate rows and up rows under two keys
    fc1 = "decoder.layers.0.mlp.linear_fc1.weight"
    assert tuple(stored[f"model.module.{fc1}_w"].size) == tuple(stored[f"model.module.{fc1}_v"].size) == (64, 32)
    assert f"optimizer.state.module.{fc1}_v.exp_avg" in stored and f"model.module.{fc1}" not in stored
    # Two ranks' shards cut the qkv weight somewhere: its chunks tile it exactly.
    chunks = stored[f"model.module.{qkv}"].chunks
    assert sum(c.sizes[0] * c.sizes[1] for c in chunks) == 96 * 32


@pytest.mark.parametrize("world, strategy", [pytest.param(*resume, marks=[pytest.mark.stress] if resume[0] == 1 else [])
                                             for resume in runs.RESUMES])
def test_resumed_at_another_dp_size_and_strategy_continues(saved, world, strategy):
    tmp, run = saved
    second = pretrain_records(tmp / f"resumed-{world}", world, [
        *runs.MODEL, "--data-parallel-sharding-strategy", strategy, "--load", str(tmp / "ck")])
    assert [r["iteration"] for r in second] == [3, 4]
    assert _losses(second) == pytest.approx(_losses(run)[2:], rel=1e-5)


def test_rectangles_cover_a_flat_range_once():
    from minitron.training.checkpointing_fsdp_dtensor import rectangles
    shape = (5, 3, 4)
    for lo, hi in [(0, 60), (7, 8), (5, 53), (12, 36), (13, 14), (11, 25)]:
        seen = []
        for start, offset, size in rectangles(shape, lo, hi):
            n = size[0] * size[1] * size[2]
            first = offset[0] * 12 + offset[1] * 4 + offset[2]
            assert first == start   # the block begins where its flat elements begin
            seen += [(a, b, c) for a in range(offset[0], offset[0] + size[0])
                     for b in range(offset[1], offset[1] + size[1]) for c in range(offset[2], offset[2] + size[2])]
            assert len(seen) <= hi - lo and n > 0
        assert sorted(a * 12 + b * 4 + c for a, b, c in seen) == list(range(lo, hi))


@pytest.mark.parametrize("extra, words", [
    (["--save", "x"], "add --ckpt-format fsdp_dtensor"),
])
def test_other_formats_are_refused_in_one_line(extra, words):
    with pytest.raises(UserError, match=words) as refused:
        validate_pretrain([*MODEL, "--use-megatron-fsdp", *extra], 2)
    assert "\n" not in str(refused.value)


def test_fsdp_dtensor_without_fsdp_is_refused():
    with pytest.raises(UserError, match="add --use-megatron-fsdp"):
        validate_pretrain([*MODEL, "--ckpt-format", "fsdp_dtensor"], 2)
