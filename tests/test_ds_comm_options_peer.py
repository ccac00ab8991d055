"""test_ds_comm_options.py's gradient-communication keys held against the real DeepSpeed 0.19.8 on
its CPU accelerator, in the same forked gloo ranks: four SGD steps (momentum, so a wrong step
shows in the next ones) give the same losses and weights (rel 1e-6; each case's wire rounds the
same way in both, so a bf16 or fp16 wire is held to the same bound), and where a key moves
parameters between the ranks' partitions (round_robin_gradients) each rank's fp32 partition is
the same one DeepSpeed's rank holds.

Keys with no effect are run too, and must change nothing against DeepSpeed running them:
allgather_partitions false (0.19.8 reads it nowhere), prescale_gradients and the predivide factor
at stage 1 with reduce_scatter (average_tensor divides by dp first whatever they say), and
reduce_scatter false at stage 3 (it only lifts DeepSpeed's checks there).
"""
import os

import pytest
import torch

from distributed import run_ranks
from deepspeed_child import NEEDS_DEEPSPEED
from test_ds_checkpoint import TiedNet, train

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it

SGD = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}
CASES = {
    "0 bf16 wire": (0, {}, {"communication_data_type": "bf16"}),
    "0 prescale": (0, {}, {"prescale_gradients": True}),
    "0 predivide 3": (0, {}, {"gradient_predivide_factor": 3.0}),
    "1 bf16 wire": (1, {}, {"communication_data_type": "bf16"}),
    "1 prescale, predivide (no effect)": (1, {}, {"prescale_gradients": True, "gradient_predivide_factor": 3.0}),
    "1 no reduce_scatter, predivide 3": (1, {"reduce_scatter": False}, {"gradient_predivide_factor": 3.0}),
    "1 contiguous false": (1, {"contiguous_gradients": False}, {}),
    "1 allgather_partitions false": (1, {"allgather_partitions": False}, {}),
    "1 round robin": (1, {"round_robin_gradients": True}, {}),
    "2 no reduce_scatter, prescale": (2, {"reduce_scatter": False}, {"prescale_gradients": True}),
    "2 no reduce_scatter, predivide 3": (2, {"reduce_scatter": False}, {"gradient_predivide_factor": 3.0}),
    "2 contiguous false, fp16 wire": (2, {"contiguous_gradients": False}, {"communication_data_type": "fp16"}),
    "2 round robin": (2, {"round_robin_gradients": True}, {}),
    "3 fp16 wire": (3, {}, {"communication_data_type": "fp16"}),
    "3 no reduce_scatter, prescale": (3, {"reduce_scatter": False}, {"prescale_gradients": True}),
}


def _config(stage, zero, top):
    return {"train_batch_size": 4, "gradient_clipping": 1.0, "optimizer": SGD, "zero_allow_untested_optimizer": True,
            "zero_optimization": {"stage": stage, **zero}, **top}


def _both(rank):
    import deepspeed   # only in the ranks: the tests' parent process stays free of it
    from minitron.runtime import initialize
    out = {}
    for name, case in CASES.items():
        for who, init in (("minitron", initialize), ("deepspeed", deepspeed.initialize)):
            engine, *_ = init(model=TiedNet(), config=_config(*case))
            losses = train(engine, rank, "fp32", range(4))
            partition = engine.optimizer.single_partition_of_fp32_groups[0] if case[0] in (1, 2) else None
            # At stage 3 a module's parameters are empty outside its forward (DeepSpeed's and
            # minitron's alike, though not as the same empty): the losses speak for the weights.
            weights = [p.detach().clone() for p in engine.module.parameters()] if case[0] < 3 else []
            out[name, who] = {"losses": losses, "weights": weights,
                              "partition": None if partition is None else partition.detach().clone()}
    return out


@pytest.fixture(scope="module")
def both():
    return run_ranks(_both, world_size=2, tp=None)


@pytest.mark.parametrize("name", list(CASES))
def test_same_losses_weights_and_partitions_as_deepspeed(both, name):
    for rank in (0, 1):
        mine, ds = both[rank][name, "minitron"], both[rank][name, "deepspeed"]
        assert mine["losses"] == pytest.approx(ds["losses"], rel=1e-6)
        for a, b in zip(mine["weights"], ds["weights"]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)
        if mine["partition"] is not None:
            torch.testing.assert_close(mine["partition"], ds["partition"], rtol=1e-6, atol=1e-8)


def test_round_robin_moves_parameters_between_partitions(both):
    """The check above can see round_robin_gradients: its partitions are not the in-order ones."""
    plain, dealt = both[0]["1 contiguous false", "deepspeed"], both[0]["1 round robin", "deepspeed"]
    assert plain["partition"].shape == dealt["partition"].shape
    assert not torch.equal(plain["partition"], dealt["partition"])
