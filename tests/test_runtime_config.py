"""DeepSpeed's config: the batch triad and the sections, resolved as DeepSpeed resolves them.

The expected triads were obtained by running DeepSpeed's own _configure_train_batch_size
(deepspeed/runtime/config.py, extracted from the source and executed on these inputs); over all
8,640 combinations of {None, 0, 1, 2, 3, 4, 6, 8, 16, 24, 32, -2}^3 × dp {1, 2, 3, 4, 8} ours gave
the same values or the same error message. Where DeepSpeed dies of a ZeroDivisionError, we give
its "has to be greater than 0" line instead.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from minitron.runtime import DeepSpeedConfig, DeepSpeedConfigError, resolve_batch_triad
from cli_here import MINITRON


# (train_batch_size, micro, grad_acc, dp) -> resolved triad, from DeepSpeed's code.
RESOLVED = [
    ((16, None, None, 4), (16, 4, 1)),
    ((None, 2, None, 4), (8, 2, 1)),
    ((16, 2, None, 4), (16, 2, 2)),
    ((16, None, 2, 4), (16, 2, 2)),
    ((None, 2, 4, 4), (32, 2, 4)),
    ((16, 2, 2, 4), (16, 2, 2)),
]
REFUSED = [
    ((10, 3, None, 1), "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size 10 != 3 * 3 * 1"),
    ((16, 3, None, 2), "16 != 3 * 2 * 2"),
    ((16, 2, None, 3), "16 != 2 * 2 * 3"),
    ((24, None, None, 16), "24 != 1 * 1 * 16"),
    ((7, None, None, 2), "7 != 3 * 1 * 2"),
    ((16, 2, 2, 2), "16 != 2 * 2 * 2"),
    ((None, None, 4, 2), "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"),
    ((-4, None, None, 1), "Train batch size: -4 has to be greater than 0"),
    ((16, 0, None, 2), "Micro batch size per gpu: 0 has to be greater than 0"),  # DeepSpeed: ZeroDivisionError
]


@pytest.mark.parametrize("given, expected", RESOLVED, ids=str)
def test_triad_resolves_as_deepspeed_does(given, expected):
    assert resolve_batch_triad(*given) == expected
    tb, mb, ga, dp = given
    config = {k: v for k, v in zip(("train_batch_size", "train_micro_batch_size_per_gpu",
                                    "gradient_accumulation_steps"), (tb, mb, ga)) if v is not None}
    resolved = DeepSpeedConfig(config, world_size=dp)
    assert (resolved.train_batch_size, resolved.train_micro_batch_size_per_gpu,
            resolved.gradient_accumulation_steps) == expected


@pytest.mark.parametrize("given, message", REFUSED, ids=str)
def test_triad_refusals_carry_deepspeeds_message(given, message):
    with pytest.raises(DeepSpeedConfigError, match=None) as err:
        resolve_batch_triad(*given)
    assert message in str(err.value)


class MPU:
    """What DeepSpeed asks of a model-parallel unit: the data-parallel size."""

    def get_data_parallel_world_size(self):
        return 2


def test_with_an_mpu_the_world_is_the_data_parallel_group():
    config = DeepSpeedConfig({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, mpu=MPU(),
                             world_size=8)
    assert config.world_size == 2 and config.train_batch_size == 16


SEED_004 = {  # the ds_config printed in the DeepSpeed reading notes (seed 004), params filled in
    "train_batch_size": 16, "steps_per_print": 2000,
    "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000}},
    "gradient_clipping": 1.0, "prescale_gradients": False, "bf16": {"enabled": False},
    "fp16": {"enabled": True, "fp16_master_weights_and_grads": False, "loss_scale": 0, "loss_scale_window": 500,
             "hysteresis": 2, "min_loss_scale": 1, "initial_scale_power": 15},
    "wall_clock_breakdown": False,
    "zero_optimization": {"stage": 0, "allgather_partitions": True, "reduce_scatter": True,
                          "allgather_bucket_size": 50000000, "reduce_bucket_size": 50000000, "overlap_comm": True,
                          "contiguous_gradients": True, "cpu_offload": False},
}


def test_the_seed_notes_config_resolves():
    config = DeepSpeedConfig(SEED_004, world_size=4)
    assert (config.train_batch_size, config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps) == (16, 4, 1)
    assert config.fp16_enabled and config.loss_scale == 0 and config.initial_dynamic_scale == 2 ** 15
    assert config.dynamic_loss_scale_args == {"init_scale": 2 ** 15, "scale_window": 500, "delayed_shift": 2,
                                              "consecutive_hysteresis": False, "min_scale": 1.0}
    assert config.zero_config.stage == 0 and config.zero_config.overlap_comm is True
    assert config.optimizer_name == "Adam" and config.optimizer_params["betas"] == [0.8, 0.999]
    assert config.scheduler_params["warmup_type"] == "log"  # DeepSpeed's default


def test_deepspeed_defaults():
    config = DeepSpeedConfig({"train_batch_size": 8})
    # gradient_clipping: 1.0 since DeepSpeed 0.19.3 (constants.py, GRADIENT_CLIPPING_DEFAULT)
    assert config.world_size == 1 and config.gradient_clipping == 1.0 and config.steps_per_print is None
    assert not config.fp16_enabled and not config.bfloat16_enabled
    zero = config.zero_config
    assert (zero.stage, zero.reduce_bucket_size, zero.allgather_bucket_size, zero.contiguous_gradients) == \
        (0, 500_000_000, 500_000_000, True)
    assert DeepSpeedConfig({"train_batch_size": 8, "zero_optimization": {"stage": 3}}).zero_config.overlap_comm
    bf16 = DeepSpeedConfig({"train_batch_size": 8, "bf16": {"enabled": True}})
    assert bf16.bfloat16_enabled and bf16.loss_scale == 1.0 and bf16.initial_dynamic_scale == 1.0


@pytest.mark.parametrize("config, message", [
    ({"train_batch_size": 8, "fp16": {"enabled": True}, "bf16": {"enabled": True}}, "both true"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 4}}, "stage must be 0, 1, 2 or 3"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "disk"}}}, "device"),
    ({"train_batch_size": 8, "zero_optimization": {"cpu_offload": True}}, "offloading the optimizer needs ZeRO"),
    ({"train_batch_size": 8, "optimizer": {"type": "ZeroOneAdam"}}, "neither DeepSpeed's own"),
    ({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9]}}}, "betas"),
    ({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"torch_adam": "yes"}}},
     "optimizer.params.torch_adam must be true or false"),
    ({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR", "params": {}}}, "total_num_steps is required"),
    ({"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}}, "warmup_type"),
    ({"train_batch_size": 8, "gradient_clipping": float("inf")}, "gradient_clipping must be a finite number"),
    ({"train_batch_size": 1e30}, "train_batch_size must be a whole number"),
    ({"train_batch_size": 8, "fp16": {"enabled": True, "min_loss_scale": 0.5}}, "fp16.min_loss_scale"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 2, "reduce_bucket_size": 0}}, "reduce_bucket_size"),
    ({"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}}, "warmup_num_steps"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 2, "contiguous_gradients": "no way"}}, "true or false"),
    ({"train_batch_size": "16"}, "whole number"),
    ({"train_batch_size": 8, "fp16": {"enabled": "maybe"}}, "true or false"),
    ({"train_batch_size": 8, "fp16": {"enabled": 2}}, "true or false"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": "one"}}, "stage must be 0, 1, 2 or 3"),
    ({"train_batch_size": 8, "prescale_gradients": True, "zero_optimization": {"stage": 2}}, "reduce scatter"),
    ({"train_batch_sise": 8}, "did you mean 'train_batch_size'"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 1, "overlap_com": True}}, "did you mean 'overlap_comm'"),
])
def test_every_invalid_value_is_one_line(config, message):
    with pytest.raises(DeepSpeedConfigError) as err:
        DeepSpeedConfig(config, world_size=2)
    assert message in str(err.value) and "\n" not in str(err.value)


# DeepSpeed 0.19.8 accepts these (its reader, hjson, turns whole floats below 1e10 into ints;
# it lower-cases an optimizer's name; clipping <= 0 is off): they resolve to its values.
ACCEPTED = [
    ({"train_batch_size": 8.0}, "train_batch_size", 8),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 1.0}}, "zero_optimization", {"stage": 1}),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}}, "zero_optimization",
     {"reduce_bucket_size": 500_000_000}),
    ({"train_batch_size": 8, "optimizer": {"type": "adam"}}, "optimizer", {"type": "Adam"}),
    ({"train_batch_size": 8, "optimizer": {"type": "ADAMW"}}, "optimizer", {"type": "AdamW"}),
    ({"train_batch_size": 8, "optimizer": {"type": "adam", "params": {"adam_w_mode": False}}}, "optimizer",
     {"type": "Adam", "params": {"lr": 1e-3, "eps": 1e-8, "weight_decay": 0.0, "betas": [0.9, 0.999],
                                 "adam_w_mode": False}}),
    # torch's Adam instead of DeepSpeed's FusedAdam (the engine builds it: tests/test_fused_adam.py)
    ({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}, "optimizer",
     {"type": "AdamW", "params": {"lr": 1e-3, "eps": 1e-8, "weight_decay": 0.0, "betas": [0.9, 0.999],
                                  "torch_adam": True}}),
    ({"train_batch_size": 8, "gradient_clipping": -1}, "gradient_clipping", -1.0),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 3, "overlap_comm": False}}, "zero_optimization",
     {"overlap_comm": False}),
    # the pydantic sections (fp16, bf16, zero_optimization) convert as pydantic v2's lax mode does,
    # and DeepSpeedConfigModel drops "auto" (the default stands)
    ({"train_batch_size": 8, "fp16": {"enabled": "yes"}}, "fp16_enabled", True),
    ({"train_batch_size": 8, "bf16": {"enabled": 1}}, "bfloat16_enabled", True),
    ({"train_batch_size": 8, "zero_optimization": {"stage": "2"}}, "zero_optimization", {"stage": 2}),
    ({"train_batch_size": 8, "zero_optimization": {"stage": "auto", "reduce_bucket_size": "auto"}},
     "zero_optimization", {"stage": 0, "reduce_bucket_size": 500_000_000}),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 1, "contiguous_gradients": "true"}}, "zero_optimization",
     {"contiguous_gradients": True}),
    ({"train_batch_size": 8, "fp16": {"enabled": True, "loss_scale": "128"}}, "loss_scale", 128.0),
]


@pytest.mark.parametrize("config, key, expected", ACCEPTED, ids=str)
def test_values_deepspeed_accepts_resolve_to_its_value(config, key, expected):
    resolved = DeepSpeedConfig(config).as_dict()[key]
    if isinstance(expected, dict):
        resolved = {k: resolved[k] for k in expected}
    assert resolved == expected and type(resolved) is type(expected)


def test_ds_config_command(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(SEED_004))
    proc = subprocess.run([MINITRON, "ds-config", str(path), "--data-parallel-size", "4", "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["train_batch_size"], out["train_micro_batch_size_per_gpu"], out["gradient_accumulation_steps"]) == (16, 4, 1)
    assert all(isinstance(out[k], int) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                  "gradient_accumulation_steps"))
    path.write_text('{"train_batch_size": 16, "train_batch_size": 8}')
    bad = subprocess.run([MINITRON, "ds-config", str(path)], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "duplicate key 'train_batch_size'" in bad.stderr
    path.write_text('{"train_batch_size": 16,')
    bad = subprocess.run([MINITRON, "ds-config", str(path)], capture_output=True, text=True)
    assert bad.returncode == 2 and str(path) in bad.stderr and "not valid JSON" in bad.stderr


LAX_VALUES = [0, 1, 2, -3, 2**70, 1.0, 1.5, 2e10, float("inf"), float("nan"), True, False, None, "1", " 7 ", "1_000",
              "5e8", "1.0", "2.", "+5", "0.00", "x", "", "true", "yes", "on", "TRUE", "Off", "n", "t", [1], {"a": 1}]


def test_lax_values_match_pydantic():
    """DeepSpeed's fp16/bf16/ZeRO sections are pydantic models in lax mode; config_values
    converts as they do. Checked against pydantic itself (typer brings it here)."""
    pydantic = pytest.importorskip("pydantic")
    from minitron.runtime.config_values import model_flag, model_int

    class Model(pydantic.BaseModel):   # the field types DeepSpeed's models use
        number: int = 0
        switch: bool = False

    for value in LAX_VALUES:
        for field, ours in (("number", lambda v: model_int({"k": v}, "k", 0, "s", minimum=-2**80)),
                            ("switch", lambda v: model_flag({"k": v}, "k", False, "s"))):
            try:
                expected = getattr(Model(**{field: value}), field)
            except pydantic.ValidationError:
                expected = "refused"
            try:
                got = ours(value)
            except DeepSpeedConfigError:
                got = "refused"
            assert got == expected and type(got) is type(expected), (field, value, got, expected)
