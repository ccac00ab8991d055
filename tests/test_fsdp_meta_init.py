"""--init-model-with-meta-device: Megatron-FSDP builds nothing full-size, and the same weights.

On 4 forked ranks a 16-layer GPT (hidden 32) is built twice through model_setup's chunk
builder and wrapped in FullyShardedDataParallel (optim_grads_params): normally, and as shapes
whose units are then built one at a time (fsdp/meta_init.py). The CPU allocator's own count
(torch.profiler's memory events: every allocation and free, with the total live after it)
gives each build's peak (scripts/fsdp_meta_init_runs.py measures; chapter 12 shows its
committed numbers, which this holds):

* the normal build's peak holds at least the whole model (measured: 897 KB, the model 846 KB);
* the meta build's peak (measured: 488 KB) stays under what FSDP keeps, this rank's shards of
  the parameters and of the gradients (2 x 212 KB: 2/dp of the model), plus three of the
  largest unit (51 KB: the rebuilt unit, its flat buffer, slack for one matrix drawn whole),
  and under 3/4 of the model. dp 4 and 16 layers, because at dp 2 the gradient shards alone
  are as big as the model;
* the weights are bit for bit the normal build's (each layer draws from a generator seeded by
  the run's seed and its index only, so building it alone draws the same numbers), so the
  losses are too: the stress case of test_fsdp_parallel.py trains it at dp 4 to the serial run's.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from minitron.cli.common import UserError, validate_pretrain

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
runs = importlib.import_module("fsdp_meta_init_runs")   # the measurement, and chapter 12's committed numbers


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    return runs.measure(tmp_path_factory.mktemp("meta"))


def test_chapter_12s_committed_numbers_are_these(builds):
    """docs/fsdp-runs/meta_init.json: the sizes exactly, the peaks to 5% (the allocator's count
    of small host objects, RNG states and the like, may move with torch's version)."""
    committed = json.loads(runs.JSON.read_text())["rank0"]
    for key in ("model", "shards", "unit", "same"):
        assert builds[0][key] == committed[key]
    for key in ("normal_peak", "meta_peak"):
        assert builds[0][key] == pytest.approx(committed[key], rel=0.05)


def test_the_weights_are_the_normal_builds_bit_for_bit(builds):
    for rank in builds:
        assert rank["same"] and rank["meta_left"] == []


def test_the_normal_build_holds_the_whole_model(builds):
    for rank in builds:
        assert rank["normal_peak"] >= rank["model"]


def test_the_meta_build_holds_shards_and_a_few_units(builds):
    for rank in builds:
        # what FSDP keeps (a shard of each unit's parameters and of its gradients), plus about
        # two of the largest unit at a time, and slack for one matrix drawn whole
        assert rank["meta_peak"] <= 2 * rank["shards"] + 3 * rank["unit"], rank
        assert rank["meta_peak"] < 0.75 * rank["model"], rank


@pytest.mark.parametrize("extra, words", [
    (["--data-parallel-sharding-strategy", "no_shard"], "no_shard"),
])
def test_what_meta_init_does_not_build_is_refused(extra, words):
    argv = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
            "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "1", "--mock-data",
            "--vocab-size", "1023", "--use-megatron-fsdp", "--init-model-with-meta-device", *extra]
    with pytest.raises(UserError, match=words) as refused:
        validate_pretrain(argv, 2)
    assert "\n" not in str(refused.value)


def test_meta_init_without_fsdp_is_refused():
    with pytest.raises(UserError, match="add --use-megatron-fsdp"):
        validate_pretrain(["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                           "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "4",
                           "--train-iters", "1", "--mock-data", "--vocab-size", "1023",
                           "--init-model-with-meta-device"], 2)

