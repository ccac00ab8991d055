"""Whole ds_configs of the kinds users run, for scripts/ds_config_surface.py: the second half of
its battery (ds_config_battery.py has the first). Each is written as the DeepSpeed tutorials,
Megatron-DeepSpeed's examples and the Hugging Face integration write them, then varied in the
ways users vary them (precision, stage, offload target, a monitor or two), so that the whole
configs are generated too: FULL gives the shapes, full_battery() their variations.
"""

from __future__ import annotations

import copy
import itertools

ADAMW = {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}}
WARMUP_DECAY = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4,
                                                     "warmup_num_steps": 100, "total_num_steps": 1000}}
ZEROPP = {"zero_hpz_partition_size": 2, "zero_quantized_weights": True, "zero_quantized_gradients": True}
S3_KNOBS = {"stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": 1e5,
            "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
            "stage3_gather_16bit_weights_on_model_save": True, "sub_group_size": 1e9}
MONITORS = {"tensorboard": {"enabled": True, "output_path": "tb/", "job_name": "gpt"},
            "csv_monitor": {"enabled": True, "output_path": "csv/", "job_name": "gpt"},
            "wandb": {"enabled": True, "project": "gpt"}}
# The Hugging Face Trainer's template: "auto" everywhere the Trainer fills the value in.
HF = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
      "gradient_clipping": "auto", "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
      "bf16": {"enabled": "auto"}, "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto",
                                                                             "eps": "auto", "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                   "warmup_num_steps": "auto"}},
      "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
                            "reduce_bucket_size": "auto", "allgather_bucket_size": 2e8}}


def _zero(stage: int, offload: str) -> dict:
    zero = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": 5e8}
    if stage == 3:
        zero.update(S3_KNOBS)
    if offload != "none":
        where = {"device": offload, "pin_memory": True}
        if offload == "nvme":
            where["nvme_path"] = "/local_nvme"
        zero["offload_optimizer"] = dict(where)
        if stage == 3:
            zero["offload_param"] = dict(where)
    return zero


def _pretrain(stage: int, precision: str, offload: str) -> dict:
    """A Megatron-DeepSpeed-style pretraining config."""
    config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 10,
              "gradient_clipping": 1.0, "zero_optimization": _zero(stage, offload), "optimizer": copy.deepcopy(ADAMW),
              "scheduler": copy.deepcopy(WARMUP_DECAY), "wall_clock_breakdown": False}
    if precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "loss_scale_window": 500, "hysteresis": 2,
                          "min_loss_scale": 1, "initial_scale_power": 12}
    elif precision == "bf16":
        config["bf16"] = {"enabled": True}
    return config


def full_battery():
    """(name, "full", config): every stage x precision x offload target that DeepSpeed documents
    (offload needs stage 2 or 3), then the same with the usual additions."""
    for stage, precision, offload in itertools.product((0, 1, 2, 3), ("fp32", "fp16", "bf16"), ("none", "cpu", "nvme")):
        if offload != "none" and stage < 2:
            continue
        yield f"full ZeRO-{stage} {precision} offload={offload}", "full", _pretrain(stage, precision, offload)
    for stage in (1, 2, 3):
        base = _pretrain(stage, "bf16", "none")
        yield f"full ZeRO-{stage} bf16 + monitors", "full", {**base, **copy.deepcopy(MONITORS)}
        yield f"full ZeRO-{stage} bf16 + activation checkpointing", "full", {
            **base, "activation_checkpointing": {"partition_activations": True, "contiguous_memory_optimization": False,
                                                 "number_checkpoints": 2, "cpu_checkpointing": False}}
        yield f"full ZeRO-{stage} bf16 + flops profiler", "full", {
            **base, "flops_profiler": {"enabled": True, "profile_step": 2, "module_depth": -1, "top_modules": 1,
                                       "detailed": True}}
        yield f"full ZeRO-{stage} bf16 + comms logger", "full", {
            **base, "comms_logger": {"enabled": True, "verbose": False, "prof_all": True}}
        yield f"full ZeRO-{stage} bf16 + communication_data_type fp32", "full", {**base, "communication_data_type": "fp32"}
        yield f"full ZeRO-{stage} Adam + WarmupCosineLR", "full", {
            **base, "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "weight_decay": 0.01}},
            "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1000, "warmup_num_steps": 50}}}
    zeropp = _pretrain(3, "bf16", "none")
    zeropp["zero_optimization"].update(ZEROPP)
    yield "full ZeRO++ (hpZ 2, qwZ, qgZ)", "full", zeropp
    for key in ZEROPP:
        one = _pretrain(3, "bf16", "none")
        one["zero_optimization"][key] = ZEROPP[key]
        yield f"full ZeRO-3 + {key}", "full", one
    yield "full Hugging Face template (ZeRO-2, auto)", "full", copy.deepcopy(HF)
    hf3 = copy.deepcopy(HF)
    hf3["zero_optimization"] = {"stage": 3, "overlap_comm": True, "reduce_bucket_size": "auto",
                                "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                                "stage3_gather_16bit_weights_on_model_save": True, "offload_optimizer": {"device": "cpu"}}
    yield "full Hugging Face template (ZeRO-3, offload, auto)", "full", hf3
    hf_resolved = copy.deepcopy(HF)   # what the Trainer hands DeepSpeed after filling "auto" in
    hf_resolved.update(train_batch_size=16, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2,
                       gradient_clipping=1.0)
    hf_resolved["fp16"]["enabled"], hf_resolved["bf16"]["enabled"] = False, True
    hf_resolved["optimizer"]["params"] = {"lr": 5e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    hf_resolved["scheduler"]["params"] = {"warmup_min_lr": 0, "warmup_max_lr": 5e-5, "warmup_num_steps": 500}
    hf_resolved["zero_optimization"]["reduce_bucket_size"] = 2e8
    yield "full Hugging Face template, filled in", "full", hf_resolved
    yield "full pipeline (Megatron-DeepSpeed, 2 stages)", "full", {
        **_pretrain(1, "bf16", "none"), "pipeline": {"stages": 2, "partition": "parameters",
                                                    "activation_checkpoint_interval": 1}}
    yield "full minimal (tutorial)", "full", {"train_batch_size": 8, "fp16": {"enabled": True},
                                              "optimizer": {"type": "Adam", "params": {"lr": 1e-4}}}
    yield "full ZeRO-2 + aio + nvme", "full", {**_pretrain(2, "bf16", "nvme"), "aio": {
        "block_size": 1048576, "queue_depth": 8, "thread_count": 1, "single_submit": False, "overlap_events": True}}
    yield "full universal checkpoint load", "full", {**_pretrain(2, "bf16", "none"), "checkpoint": {"load_universal": True}}
    yield "full bf16 + data_types fp32 accumulation", "full", {**_pretrain(1, "bf16", "none"),
                                                            "data_types": {"grad_accum_dtype": "fp32"}}
    yield "full gradient_accumulation given, ZeRO-1 fp16", "full", {
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4, "fp16": {"enabled": True},
        "zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8}, "optimizer": copy.deepcopy(ADAMW)}
