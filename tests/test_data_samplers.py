"""Samplers: data-parallel ranks never share a sample; a resumed run continues the same order;
the data flags reject what cannot work before any rank starts."""

from __future__ import annotations

import pytest

from minitron.training.argument_groups import ArgumentError, build_parser
from minitron.training.datasets.arguments import validate_data_args
from minitron.training.datasets.data_samplers import (
    MegatronPretrainingRandomSampler, MegatronPretrainingSampler,
)

TOTAL, MICRO, DP = 103, 2, 4


def sampler(kind, rank, consumed=0, sharding=True, dp=DP):
    if kind == "single":
        return MegatronPretrainingSampler(TOTAL, consumed, MICRO, rank, dp)
    return MegatronPretrainingRandomSampler(None, TOTAL, consumed, MICRO, rank, dp, sharding)


@pytest.mark.parametrize("kind,sharding", [("single", True), ("cyclic", True), ("cyclic", False)])
def test_no_sample_is_seen_by_two_dp_ranks(kind, sharding):
    per_rank = [[i for batch in sampler(kind, r, sharding=sharding) for i in batch] for r in range(DP)]
    seen = [i for indices in per_rank for i in indices]
    assert len(seen) == len(set(seen))                              # disjoint
    if sharding:
        assert len(seen) == TOTAL - TOTAL % (MICRO * DP)            # every whole round is used
        assert len({len(x) for x in per_rank}) == 1                 # same number of steps
    else:
        # Megatron deals out a permutation of (TOTAL // MICRO) * MICRO = 102 indices round-robin:
        # ranks get 26, 26, 25, 25 of them, so 13, 13, 12, 12 whole micro batches (see
        # tests/test_fidelity_data.py for its exact order).
        assert [len(x) for x in per_rank] == [26, 26, 24, 24] and max(seen) < 102


def test_sequential_rounds_are_sliced_by_rank():
    assert list(sampler("single", 1))[:2] == [[2, 3], [10, 11]]    # round 0 is 0..7, round 1 8..15


@pytest.mark.parametrize("kind,sharding", [("single", True), ("cyclic", True), ("cyclic", False)])
def test_resume_from_consumed_samples_continues_the_order(kind, sharding):
    for rank in range(DP):
        full = list(sampler(kind, rank, sharding=sharding))
        for steps in (1, 5):                                        # stopped after `steps` iterations
            consumed = steps * MICRO * DP
            assert list(sampler(kind, rank, consumed, sharding))[: len(full) - steps] == full[steps:]


def test_cyclic_sampler_reshuffles_each_epoch_and_resumes_across_epochs():
    s = sampler("cyclic", 0)
    epoch0 = list(s)
    epoch1 = list(s)                                                # the same object, next pass
    assert sorted(sum(epoch0, [])) == sorted(sum(epoch1, [])) and epoch0 != epoch1
    usable = TOTAL - TOTAL % (MICRO * DP)
    resumed = list(sampler("cyclic", 0, consumed=usable + 3 * MICRO * DP))
    assert resumed == epoch1[3:]


def test_sampler_errors_are_clear():
    with pytest.raises(ValueError, match="no samples left: 103 consumed of 103"):
        MegatronPretrainingSampler(TOTAL, TOTAL, MICRO, 0, DP)
    with pytest.raises(ValueError, match="dp rank 4 of 4"):
        MegatronPretrainingSampler(TOTAL, 0, MICRO, 4, DP)


def parse(argv):
    args = build_parser().parse_args(argv)
    validate_data_args(args)
    return args


def test_data_flags_defaults_and_errors(tmp_path):
    args = parse(["--mock-data"])
    assert args.dataloader_type == "single" and args.data_sharding and args.create_attention_mask_in_dataloader
    with pytest.raises(ArgumentError, match="exclude each other"):
        parse(["--mock-data", "--data-path", "x"])
    with pytest.raises(ArgumentError, match=r"x\.idx and .*x\.bin not found"):
        parse(["--data-path", str(tmp_path / "x")])
    with pytest.raises(ArgumentError, match="WEIGHT PREFIX"):
        parse(["--data-path", "0.5", "a", "b", "c"])
    with pytest.raises(ArgumentError, match="--split"):
        parse(["--mock-data", "--split", "90,-1"])
    with pytest.raises(ArgumentError, match="needs --vocab-file"):
        parse(["--mock-data", "--tokenizer-type", "GPT2BPETokenizer"])
