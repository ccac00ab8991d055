"""An MoE checkpoint whose experts are split otherwise than the dense layers
(--expert-tensor-parallel-size 1 under --tensor-model-parallel-size 2, as eleven of Megatron's
MoE CI cases run): torch_dist saves it and any layout resumes it; the legacy format is refused.
And --check-weight-hash-across-dp-replicas-interval's check, on two forked replicas."""

from __future__ import annotations

import pytest

from distributed import pretrain_records, run_ranks
from minitron.training.argument_groups import ArgumentError
from minitron.training.arguments import GPT_ARGS_DEFAULTS, megatron_parser, validate_args

MOE = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
       "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "4", "--lr", "1e-2",
       "--mock-data", "--vocab-size", "127", "--make-vocab-size-divisible-by", "32",
       "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7", "--distributed-backend", "gloo",
       "--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "1e-2", "--disable-bias-linear"]
ETP1_UNDER_TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2",
                  "--expert-tensor-parallel-size", "1"]


def _validated(*extra):
    args = megatron_parser().parse_args([*MOE, *ETP1_UNDER_TP2, *extra])
    args.rank, args.world_size, args.distributed_backend = 0, 4, "gloo"
    return validate_args(args, dict(GPT_ARGS_DEFAULTS))


def test_torch_dist_accepts_and_legacy_refuses_etp_unlike_tp(tmp_path):
    assert _validated("--save", str(tmp_path / "ck")).ckpt_format == "torch_dist"
    with pytest.raises(ArgumentError, match="^--ckpt-format torch keeps one file per .* use --ckpt-format torch_dist"):
        _validated("--save", str(tmp_path / "ck"), "--ckpt-format", "torch")


@pytest.mark.stress   # three runs, one of four ranks: ~10 s of CPU
def test_saved_at_etp1_under_tp2_resumes_serially(tmp_path):
    serial = pretrain_records(tmp_path / "serial", 1, MOE)
    # (the replicas' weight hashes compared each iteration too: dense over dp 2, experts over expert-dp 2)
    pretrain_records(tmp_path / "first", 4, MOE + ETP1_UNDER_TP2 + ["--exit-interval", "2", "--save", str(tmp_path / "ck"),
                                                                   "--check-weight-hash-across-dp-replicas-interval", "1"])
    resumed = pretrain_records(tmp_path / "resumed", 1, MOE + ["--load", str(tmp_path / "ck")])
    assert [r["iteration"] for r in resumed] == [3, 4]
    assert [r["lm_loss"] for r in resumed] == pytest.approx([r["lm_loss"] for r in serial[2:]], rel=1e-5)


def _hash_check(rank: int):
    """Two data-parallel replicas of one linear layer, equal, then rank 1's weight nudged by one ulp."""
    import torch

    from minitron.training.weight_hash import check_param_hashes_across_dp_replicas
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    check_param_hashes_across_dp_replicas([layer], 1)   # equal: passes on both
    if rank == 1:
        with torch.no_grad():
            layer.weight[0, 0] = torch.nextafter(layer.weight[0, 0], torch.tensor(2.0))
    try:
        check_param_hashes_across_dp_replicas([layer], 2)
    except RuntimeError as err:
        return str(err)
    return None


def test_weight_hash_check_names_the_parameter_that_differs():
    said = run_ranks(_hash_check, world_size=2)
    assert said[0] == ("--check-weight-hash-across-dp-replicas-interval: at iteration 2 0.weight on rank 0 "
                       "differs from its replica on rank(s) [1]")
    assert said[1].endswith("on rank 1 differs from its replica on rank(s) [0]")
