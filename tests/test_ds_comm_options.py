"""How gradients cross the data-parallel group (runtime/gradient_reduction.py): the ds_config's
communication_data_type, prescale_gradients and gradient_predivide_factor, and ZeRO's
contiguous_gradients, reduce_scatter, allgather_partitions and round_robin_gradients, read and
refused as DeepSpeed 0.19.8 reads and refuses them, and run on two forked gloo ranks.

The reduced gradient each engine hands its optimizer is held against the same arithmetic done by
hand on both ranks' local gradients (gathered by the test), exactly: a bf16 wire rounds where the
hand computation rounds, a predivide factor of 3 multiplies where it does. test_ds_comm_options_peer.py
holds the same runs against DeepSpeed's own engine.
"""

import pytest
import torch

from distributed import run_ranks
from minitron.runtime.config import DeepSpeedConfig
from minitron.runtime.config_values import DeepSpeedConfigError
from minitron.runtime.gradient_reduction import for_stage
from test_ds_checkpoint import TiedNet, batch

BASE = {"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_allow_untested_optimizer": True}


def cfg(stage=0, zero=None, **top):
    return {**BASE, "zero_optimization": {"stage": stage, **(zero or {})}, **top}


@pytest.mark.parametrize("config, where, dtype, prescale, predivide, all_reduce", [
    (cfg(), "engine", None, False, 1.0, True),
    (cfg(communication_data_type="BF16", prescale_gradients=True), "engine", torch.bfloat16, True, 1.0, True),
    (cfg(1, gradient_predivide_factor=3), "divide", None, False, 1.0, False),     # read by nothing there
    (cfg(1, {"reduce_scatter": False}, gradient_predivide_factor=3), "zero", None, False, 3.0, True),
    (cfg(2, {"contiguous_gradients": False}), "divide", None, False, 1.0, True),
    (cfg(3, {"reduce_scatter": False}, prescale_gradients=True), "divide", None, False, 1.0, False),
])
def test_each_stage_reduces_where_deepspeed_does(config, where, dtype, prescale, predivide, all_reduce):
    red = for_stage(DeepSpeedConfig(config, world_size=2), dp=2)
    assert (red.where, red.dtype, red.prescale, red.predivide, red.all_reduce) == \
        (where, dtype, prescale, predivide, all_reduce)


def test_zero_flags_default_and_resolve():
    zero = DeepSpeedConfig(cfg(2, {"allgather_partitions": "false", "round_robin_gradients": 1}), world_size=2)
    nested = ("stage3", "offload_optimizer", "offload_param")   # sections of their own (stage3_config.py, offload)
    assert {k: v for k, v in zero.as_dict()["zero_optimization"].items() if k not in nested} == {
        "stage": 2, "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000, "overlap_comm": False,
        "contiguous_gradients": True, "reduce_scatter": True, "allgather_partitions": False,
        "round_robin_gradients": True, "compute_grad_norm": True, "use_multi_rank_bucket_allreduce": True,
        "load_from_fp32_weights": True, "ignore_unused_parameters": True, "elastic_checkpoint": False}
    assert zero.communication_data_type is None and zero.gradient_predivide_factor == 1.0


@pytest.mark.parametrize("config, words", [
    (cfg(2, prescale_gradients=True), "prescale_gradients is not supported by DeepSpeed's ZeRO stage 2"),
    (cfg(3, gradient_predivide_factor=2.0), "stage 3 with reduce scatter"),
    (cfg(3, {"reduce_scatter": False}, gradient_predivide_factor=2.0), "not modelled"),
    (cfg(communication_data_type="int8"), 'must be "fp32", "fp16" or "bf16"'),
    (cfg(communication_data_type=16), 'must be "fp32", "fp16" or "bf16"'),
    (cfg(gradient_predivide_factor=0), "must be positive"),
    (cfg(prescale_gradients="yes"), "true or false"),
])
def test_refused_in_one_line(config, words):
    with pytest.raises(DeepSpeedConfigError) as refused:
        DeepSpeedConfig(config, world_size=2)
    assert words in str(refused.value) and "\n" not in str(refused.value)


CASES = {
    "bf16 wire, stage 0": (cfg(communication_data_type="bf16"),
                           lambda a, b: ((a.bfloat16() + b.bfloat16()) * 0.5).float()),
    "prescale, stage 0": (cfg(prescale_gradients=True), lambda a, b: a * 0.5 + b * 0.5),
    "predivide 3, stage 0": (cfg(gradient_predivide_factor=3.0),
                             lambda a, b: (a * (1 / 3) + b * (1 / 3)) * (3.0 / 2)),
    "predivide 3, stage 2, no reduce_scatter": (cfg(2, {"reduce_scatter": False}, gradient_predivide_factor=3.0),
                                                lambda a, b: (a * (1 / 3) + b * (1 / 3)) * (3.0 / 2)),
    "bf16 wire, stage 1": (cfg(1, communication_data_type="bf16"),
                           lambda a, b: (a.bfloat16() / 2 + b.bfloat16() / 2).float()),
    "fp16 wire, stage 3": (cfg(3, communication_data_type="fp16"),
                           lambda a, b: (a.half() / 2 + b.half() / 2).float()),
}


def _reduced(rank):
    """Each case: this rank's gradient partition after one backward, and every rank's local flat gradient."""
    import torch.distributed as dist
    from minitron.runtime import initialize
    out = {}
    for name, (config, _) in CASES.items():
        engine, *_ = initialize(model=TiedNet(), config=config)
        x, y = batch(0, rank, "fp32")
        loss = torch.nn.functional.mse_loss(engine(x), y)
        reference = TiedNet()   # the same weights: a local backward the engine does not reduce
        torch.nn.functional.mse_loss(reference(x), y).backward()
        local = torch.cat([p.grad.reshape(-1) for p in _flat_order(engine, reference)])
        gathered = [torch.empty_like(local) for _ in range(2)]
        dist.all_gather(gathered, local)
        engine.backward(loss)
        out[name] = {"mine": engine.optimizer.averaged_gradients[0].clone(), "locals": gathered,
                     "offset": engine.optimizer.partition_id * engine.optimizer.averaged_gradients[0].numel(),
                     "stage3_sizes": [p.ds_numel for p in engine.optimizer.fp16_groups[0]]
                     if engine.zero_optimization_stage() == 3 else None}
    return out


def _stage3_piece(full: torch.Tensor, sizes: list, rank: int) -> torch.Tensor:
    """ZeRO 3 partitions each parameter on its own: rank r holds piece r of every one (padded)."""
    pieces, at = [], 0
    for n in sizes:
        piece = -(-n // 2)
        padded = torch.cat([full[at:at + n], full.new_zeros(2 * piece - n)])
        pieces.append(padded[rank * piece:(rank + 1) * piece])
        at += n
    return torch.cat(pieces)


def _flat_order(engine, reference):
    """The reference's parameters in the order of the engine's flat buffer."""
    groups = getattr(engine.optimizer, "fp16_groups", None) or engine.optimizer.bit16_groups
    index = {id(p): k for k, p in enumerate(engine.module.parameters())}
    mine = list(reference.parameters())
    return [mine[index[id(p)]] for p in groups[0]]


@pytest.fixture(scope="module")
def reduced():
    return run_ranks(_reduced, world_size=2, tp=None)


@pytest.mark.parametrize("name", list(CASES))
def test_reduced_gradient_is_the_configured_arithmetic(reduced, name):
    for rank in (0, 1):
        got = reduced[rank][name]
        a, b = got["locals"]
        expected = CASES[name][1](a, b)
        if got["stage3_sizes"]:
            expected, got["offset"] = _stage3_piece(expected, got["stage3_sizes"], rank), 0
        mine = got["mine"][:max(0, expected.numel() - got["offset"])]   # the partition, less its padding
        torch.testing.assert_close(mine, expected[got["offset"]:got["offset"] + mine.numel()], rtol=0, atol=0)
