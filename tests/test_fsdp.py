"""Megatron-FSDP (--use-megatron-fsdp): every sharding strategy trains the serial model's numbers.

pretrain_gpt on forked gloo ranks, three iterations of a 2-layer GPT with gradient clipping
(so the norm, summed over shards, matters): at dp 2 each of no_shard, optim, optim_grads and
optim_grads_params gives the serial run's losses and gradient norms to 1e-5 (relative; what
differs is only the order of the sums). The traced optim_grads_params run shows each layer
all-gathered inside forward_step before that layer runs, again inside backward, and its
gradients reduce-scattered there, and --log-params-norm sums the shards to the serial norm.
The default run keeps one strategy; the others, dp 2 x tp 2, bf16 against DDP and bf16
gradient reductions (--megatron-fsdp-grad-comm-dtype) are stress cases.
"""

from __future__ import annotations

import pytest

from distributed import pretrain_records
from minitron.cli.common import UserError, validate_pretrain
from minitron.trace.reader import load_trace

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "3", "--lr", "1e-2",
         "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo", "--clip-grad", "1.0", "--log-params-norm"]
TOL = 1e-5
FSDP = "minitron.core.distributed.fsdp."


def _curve(records):
    return [(r["lm_loss"], r["grad_norm"]) for r in records]


@pytest.fixture(scope="module")
def serial_records(tmp_path_factory):
    return pretrain_records(tmp_path_factory.mktemp("serial") / "run", 1, MODEL)


@pytest.fixture(scope="module")
def serial(serial_records):
    return _curve(serial_records)


def _assert_close(curve, serial):
    assert len(curve) == len(serial) == 3
    for (loss, norm), (s_loss, s_norm) in zip(curve, serial):
        assert abs(loss - s_loss) <= TOL * abs(s_loss) and abs(norm - s_norm) <= TOL * s_norm, (curve, serial)
    assert serial[-1][0] < serial[0][0]   # the weights moved: the gathers carried new values


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """optim_grads_params (Megatron's default strategy) at dp 2, traced: (curve, rank 0's records)."""
    out = tmp_path_factory.mktemp("fsdp")
    records = pretrain_records(out / "run", 2, [*MODEL, "--use-megatron-fsdp"], trace_dir=out / "trace")
    return _curve(records), load_trace(out / "trace")[0], records


def test_optim_grads_params_equals_serial(sharded_run, serial):
    _assert_close(sharded_run[0], serial)


def test_params_norm_sums_the_shards(sharded_run, serial_records):
    """--log-params-norm reads each rank's pieces and sums them over dp (training/utils.py):
    the serial model's norm (to 1e-6 relative: fp32 sums in another order)."""
    for mine, theirs in zip(sharded_run[2], serial_records):
        assert mine["params_norm"] == pytest.approx(theirs["params_norm"], rel=1e-6)


@pytest.mark.stress
@pytest.mark.parametrize("strategy", ["no_shard", "optim", "optim_grads"])
def test_each_strategy_equals_serial(strategy, serial, tmp_path):
    argv = [*MODEL, "--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy]
    _assert_close(_curve(pretrain_records(tmp_path / "run", 2, argv)), serial)


@pytest.mark.stress
def test_tensor_parallel_with_fsdp_equals_serial(serial, tmp_path):
    argv = [*MODEL, "--use-megatron-fsdp", "--tensor-model-parallel-size", "2"]
    _assert_close(_curve(pretrain_records(tmp_path / "run", 4, argv)), serial)


@pytest.mark.stress
def test_bf16_equals_ddp(tmp_path):
    """bf16 weights, fp32 main pieces and fp32 gradients (Megatron's default for bf16) against
    DDP at dp 2. Not bit for bit: DDP lets autograd add the micro-batches' gradients in bf16
    before its fp32 buffer sees them; FSDP adds each micro-batch's into fp32 (measured: the loss
    3e-5 apart, the norm 2e-3)."""
    ddp = _curve(pretrain_records(tmp_path / "ddp", 2, [*MODEL, "--bf16"]))
    fsdp = _curve(pretrain_records(tmp_path / "fsdp", 2, [*MODEL, "--bf16", "--use-megatron-fsdp"]))
    for (loss, norm), (d_loss, d_norm) in zip(fsdp, ddp):
        assert abs(loss - d_loss) <= 1e-4 * d_loss and abs(norm - d_norm) <= 1e-2 * d_norm, (fsdp, ddp)


@pytest.mark.stress
def test_grad_comm_dtype_bf16_rounds_the_reductions(serial, tmp_path):
    """--megatron-fsdp-grad-comm-dtype bf16 on an fp32 model: the gradients are sent and summed in
    bf16, so the norms leave the serial run's by bf16's rounding (measured 1.8e-3 relative at
    dp 4; here dp 2), more than fp32's sums (1e-5) and less than 1e-2."""
    argv = [*MODEL, "--use-megatron-fsdp", "--megatron-fsdp-grad-comm-dtype", "bf16"]
    curve = _curve(pretrain_records(tmp_path / "run", 2, argv))
    worst = max(abs(n - s_n) / s_n for (_, n), (_, s_n) in zip(curve, serial))
    assert TOL < worst < 1e-2, (curve, serial)


def _ancestors(record, by_id):
    names = []
    while record.get("parent") in by_id:
        record = by_id[record["parent"]]
        names.append(record["name"].rsplit(".", 1)[-1])
    return names


def test_trace_gathers_each_layer_before_it_runs(sharded_run):
    records = sharded_run[1]
    by_id = {r["id"]: r for r in records}
    step = [r for r in records if r["name"].endswith("training.train_step")][1]
    inside = [r for r in records if step["start_us"] <= r["start_us"] <= step["end_us"]]
    gathers = [r for r in inside if r["name"] == FSDP + "unit.FSDPUnit._all_gather"]
    forward = [r["args"]["unit"] for r in gathers if "backward_step" not in _ancestors(r, by_id)]
    backward = [r["args"]["unit"] for r in gathers if "backward_step" in _ancestors(r, by_id)]
    # Per micro-batch (2 per rank): the rest of the chunk (embedding..output), then layer by layer.
    assert forward == ["(rest)", "decoder.layers.0", "decoder.layers.1"] * 2
    # Backward gathers them again in reverse, each just before its own backward.
    assert backward == ["(rest)", "decoder.layers.1", "decoder.layers.0"] * 2
    for r in gathers:   # the collective itself, named by its group, with this rank's shard's shape
        (coll,) = [c for c in records if c.get("parent") == r["id"]]
        assert coll["name"] == "torch.distributed.all_gather_into_tensor"
        assert coll["args"]["group"] == "DATA_PARALLEL_GROUP_WITH_CP" and coll["args"]["shape"] == [r["args"]["numel"] // 2]
    scatters = [r for r in inside if r["name"] == "torch.distributed.reduce_scatter_tensor"]
    assert len(scatters) == 3 * 2 and all("backward_step" in _ancestors(r, by_id) for r in scatters)
    assert not [r for r in inside if r["name"] == "torch.distributed.all_reduce"
                and r["args"]["group"] == "DATA_PARALLEL_GROUP_WITH_CP" and r["args"]["shape"] != [2]]


@pytest.mark.parametrize("extra, words", [
    (["--check-weight-hash-across-dp-replicas-interval", "1"], "optim_grads_params does not keep"),
    (["--data-parallel-sharding-strategy", "zero3"], "invalid choice"),
    (["--outer-dp-sharding-strategy", "optim", "--data-parallel-sharding-strategy", "optim"],
     "needs --data-parallel-sharding-strategy optim_grads_params"),
])
def test_what_is_not_built_is_refused_in_one_line(extra, words):
    with pytest.raises(UserError, match=words) as refused:
        validate_pretrain([*MODEL, "--use-megatron-fsdp", *extra], 2)
    assert "\n" not in str(refused.value)
