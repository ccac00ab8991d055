"""The ds_config's engine switches (runtime/config_engine.py, runtime/engine_switches.py), read and
run as DeepSpeed 0.19.8 reads and runs them, on two forked gloo ranks.

gradient_allreduce_op "sum" leaves the gradient dp times the mean's (an SGD step twice as long);
managed_gradient_accumulation false makes each step() the boundary, so two backward() calls and
one step() land where the managed engine's two micro-steps land; dataloader_drop_last drops the
short batch; disable_python_gc holds the collector off until destroy(); dump_state prints on
rank 0, as does memory_breakdown, and log_level silences what is below it; data_types.keep_in_fp32_modules keeps a buffer
fp32 in a bf16 model; checkpoint.tag_validation "Fail" refuses a tag that differs across ranks.
test_ds_engine_switches_peer.py holds the same runs against DeepSpeed's own engine.
"""

import contextlib
import io
import logging
import re
import tempfile

import pytest
import torch

from distributed import run_ranks
from minitron.runtime.config import DeepSpeedConfig
from minitron.runtime.config_values import DeepSpeedConfigError
from test_ds_checkpoint import TiedNet, batch

BASE = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_allow_untested_optimizer": True}


def cfg(stage=0, gas=1, **top):
    return {**BASE, "gradient_accumulation_steps": gas, "zero_optimization": {"stage": stage}, **top}


@pytest.mark.parametrize("config, words", [
    (cfg(3, gradient_allreduce_op="sum"), "not supported with ZeRO stage 3"),
    (cfg(gradient_allreduce_op="max"), "must be one of 'mean', 'sum'"),
    (cfg(log_level=42), "must be one of 'debug'"),
    (cfg(vocabulary_size="big"), "whole number"),
    (cfg(dump_state="nope"), "true or false"),
    (cfg(seq_parallel_communication_data_type="int3"), "must be one of 'fp32'"),
    (cfg(1, managed_gradient_accumulation=False, zero_optimization={"stage": 1, "overlap_comm": True}),
     "overlap_comm only with ZeRO stage 2"),
    ({**BASE, "optimizer": {"type": "AdamW", "params": {"amsgrad": True}}}, "do not support the AMSGrad"),
])
def test_refused_in_one_line(config, words):
    with pytest.raises(DeepSpeedConfigError) as refused:
        DeepSpeedConfig(config, world_size=2)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_read_as_deepspeed_reads_them():
    resolved = DeepSpeedConfig(cfg(2, gradient_allreduce_op="SUM", prescale_gradients=True, log_level="INFO",
                                   disable_allgather=True, use_data_before_expert_parallelism=True),
                               world_size=2).as_dict()
    # DeepSpeed lower-cases both, and with a sum it never reads prescale_gradients at reduce-scatter
    assert (resolved["gradient_allreduce_op"], resolved["log_level"]) == ("sum", "info")
    assert resolved["disable_allgather"] and resolved["use_data_before_expert_parallelism"]
    # given, accepted, and changing nothing in minitron's engine: each with why (`minitron ds-config`)
    assert set(resolved["no_effect"]) == {"disable_allgather", "use_data_before_expert_parallelism"}
    adamw = DeepSpeedConfig({**BASE, "optimizer": {"type": "AdamW", "params": {"bias_correction": False}}},
                            world_size=2)
    assert adamw.optimizer_params["bias_correction"] is False


def _train(config, rank, micro_batches, steps_after=None):
    """The engine after ``micro_batches`` forward/backward pairs, step() after each (or only after
    the ones listed in ``steps_after``): its weights and counters."""
    from minitron.runtime import initialize
    engine, *_ = initialize(model=TiedNet(), config=config)
    for i in range(micro_batches):
        x, y = batch(i, rank, "fp32")
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        if steps_after is None or i in steps_after:
            engine.step()
    out = {"weights": torch.cat([p.detach().reshape(-1) for p in engine.module.parameters()]),
           "global_steps": engine.global_steps, "global_samples": engine.global_samples}
    engine.destroy()
    return out


def _on_rank(rank):
    import gc
    from minitron.runtime import initialize
    from minitron.runtime.utils import logger
    start = torch.cat([p.detach().reshape(-1) for p in TiedNet().parameters()])
    out = {"start": start}
    for stage in (0, 2):
        out[f"mean{stage}"] = _train(cfg(stage), rank, 1)
        out[f"sum{stage}"] = _train(cfg(stage, gradient_allreduce_op="sum"), rank, 1)
    for stage in (0, 1, 2):
        out[f"managed{stage}"] = _train(cfg(stage, gas=2), rank, 4)
        out[f"unmanaged{stage}"] = _train(cfg(stage, gas=2, managed_gradient_accumulation=False), rank, 4, (1, 3))
    # drop_last: 10 samples over 2 ranks, 5 each, micro-batch 2 -> batches of 2, 2, 1 or 2, 2
    data = torch.utils.data.TensorDataset(torch.arange(10.0))
    for drop in (False, True):
        engine, _, loader, _ = initialize(model=TiedNet(), config=cfg(dataloader_drop_last=drop), training_data=data)
        out[f"batches_drop{drop}"] = [len(b[0]) for b in loader]
    # disable_python_gc: off while the engine lives, back on after destroy()
    engine, *_ = initialize(model=TiedNet(), config=cfg(disable_python_gc=True))
    out["gc_while"] = gc.isenabled()
    engine.destroy()
    out["gc_after"] = gc.isenabled()
    # memory_breakdown: rank 0 prints around forward, backward and step
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _train(cfg(memory_breakdown=True), rank, 1)
    out["memory"] = printed.getvalue()
    # keep_in_fp32_modules: the TiedNet's "scale" buffer stays fp32 in a bf16 model
    for keep in ([], ["sca*"]):
        engine, *_ = initialize(model=TiedNet(), config=cfg(bf16={"enabled": True},
                                                            data_types={"keep_in_fp32_modules": keep}))
        out[f"scale_keep{keep}"] = engine.module.scale.dtype
    # tag_validation: a tag with the rank in it, "Fail" refuses it, "Warn" (the default) logs and saves
    engine, *_ = initialize(model=TiedNet(), config=cfg(checkpoint={"tag_validation": "Fail"}))
    with tempfile.TemporaryDirectory() as folder:
        try:
            engine.save_checkpoint(folder, tag=f"step1-rank{rank}")
            out["fail"] = None
        except ValueError as refused:
            out["fail"] = str(refused)
        engine._config.features.tag_validation = "IGNORE"
        out["ignored"] = engine.save_checkpoint(folder, tag=f"step1-rank{rank}")
    # dump_state and the vocabulary warning through the engine's logger; log_level "error" silences both
    for level in (None, "error"):
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        logger.addHandler(handler)
        try:
            initialize(model=TiedNet(), config=cfg(dump_state=True, vocabulary_size=50257,
                                                   **({"log_level": level} if level else {})))
        finally:
            logger.removeHandler(handler)
            logger.setLevel(logging.INFO)
        out[f"log_{level}"] = stream.getvalue()
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_on_rank, world_size=2, tp=None)


def test_sum_steps_dp_times_the_mean(ranks):
    # SGD: the step is lr times the gradient, so the sum's step is exactly dp = 2 times the mean's
    # up to the float32 rounding of weight - step (a few ulps of the weights)
    for rank in (0, 1):
        got = ranks[rank]
        for stage in (0, 2):
            mean_step = got["start"] - got[f"mean{stage}"]["weights"]
            sum_step = got["start"] - got[f"sum{stage}"]["weights"]
            torch.testing.assert_close(sum_step, 2 * mean_step, rtol=1e-5, atol=1e-6)
            assert mean_step.abs().max() > 1e-4   # a step was taken


def test_unmanaged_step_is_the_boundary(ranks):
    for rank in (0, 1):
        got = ranks[rank]
        for stage in (0, 1, 2):
            managed, unmanaged = got[f"managed{stage}"], got[f"unmanaged{stage}"]
            # the same two updates from the same sums: equal to the bit
            assert torch.equal(managed["weights"], unmanaged["weights"])
            assert (unmanaged["global_steps"], unmanaged["global_samples"]) == (2, 16) == \
                (managed["global_steps"], managed["global_samples"])


def test_drop_last_drops_the_short_batch(ranks):
    assert ranks[0]["batches_drop" + "False"] == [2, 2, 1] and ranks[0]["batches_dropTrue"] == [2, 2]


def test_python_gc_held_while_the_engine_lives(ranks):
    assert (ranks[1]["gc_while"], ranks[1]["gc_after"]) == (False, True)


def test_memory_breakdown_prints_on_rank_0(ranks):
    lines = ranks[0]["memory"].splitlines()
    for when in ("Engine before forward", "Engine after forward", "Engine before backward",
                 "Engine after backward", "Engine before step", "Engine after step"):
        assert when in lines and lines[lines.index(when) + 1].startswith("MA ")
        assert lines[lines.index(when) + 2].startswith("CPU Virtual Memory:  used = ")
    assert ranks[1]["memory"] == ""


def test_keep_in_fp32_buffers(ranks):
    assert (ranks[0]["scale_keep[]"], ranks[0]["scale_keep['sca*']"]) == (torch.bfloat16, torch.float32)


def test_tag_validation(ranks):
    for rank in (0, 1):
        assert "not consistent across all ranks" in ranks[rank]["fail"] and ranks[rank]["ignored"] is True


def test_dump_state_and_log_level(ranks):
    rank0, rank1 = ranks[0]["log_None"], ranks[1]["log_None"]
    assert "DeepSpeedEngine:" in rank0 and re.search(r"^  global_steps \.+ 0$", rank0, re.M)
    assert "DeepSpeedEngine:" not in rank1                      # rank 0 only
    assert "vocabulary size 50257 is not aligned to 8" in rank1  # every rank warns
    assert ranks[0]["log_error"] == ""                           # below "error": nothing
