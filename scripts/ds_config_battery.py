"""The ds_configs scripts/ds_config_surface.py gives minitron and DeepSpeed 0.19.8: generated from
the tables below, one row per documented key of DeepSpeed's config surface.

Each row (section, key, default, typical, bad) becomes three configs: the key at DeepSpeed's
default, at a value a user would write instead, and at a value of the wrong kind or range. A
row's section is a dotted path (zero_optimization.offload_optimizer); a key that only means
something in a context (stage 3's knobs, fp16's scaler) is tried inside it (``CONTEXT``). The
batch triad is tried in every combination of given and missing; each optimizer and scheduler
type DeepSpeed knows, with its params; a few misspelt keys (what a user types by mistake);
and realistic whole configs. Each config carries a ``kind`` (default, typical, bad, unknown,
triad, type, full) that the report uses to classify a disagreement, so the classes come from
what the config was built to be, not from reading the refusal. Nothing here imports minitron
or DeepSpeed.
"""

from __future__ import annotations

import copy
import itertools

DP = 2   # the data-parallel size both sides are given
BASE = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2}   # 8 = 2 x 2 x dp 2
S1, S2, S3 = ({"zero_optimization": {"stage": s}} for s in (1, 2, 3))
FP16 = {"fp16": {"enabled": True}}
BF16 = {"bf16": {"enabled": True}}

# (section, key, default, typical, bad): DeepSpeed 0.19.8's runtime/constants.py, config.py and
# the pydantic models of zero/config.py, zero/offload_config.py, precision_config.py,
# monitor/config.py, comm/config.py; activation_checkpointing/config.py, profiling/constants.py,
# swap_tensor/constants.py for the dict sections.
KEYS = [
    ("", "steps_per_print", None, 100, "ten"),
    ("", "gradient_clipping", 1.0, 0.5, "max"),
    ("", "prescale_gradients", False, True, "yes please"),
    ("", "gradient_predivide_factor", 1.0, 2.0, "two"),
    ("", "communication_data_type", None, "bf16", "int3"),
    ("", "seq_parallel_communication_data_type", "fp32", "bf16", "int3"),
    ("", "gradient_allreduce_op", "mean", "sum", "max"),
    ("", "disable_allgather", False, True, "nope"),
    ("", "dump_state", False, True, "nope"),
    ("", "disable_python_gc", False, True, "nope"),
    ("", "vocabulary_size", None, 50304, "big"),
    ("", "wall_clock_breakdown", False, True, "nope"),
    ("", "memory_breakdown", False, True, "nope"),
    ("", "zero_allow_untested_optimizer", False, True, "nope"),
    ("", "zero_force_ds_cpu_optimizer", True, False, "nope"),
    ("", "dataloader_drop_last", False, True, "nope"),
    ("", "use_data_before_expert_parallelism", False, True, "nope"),
    ("", "managed_gradient_accumulation", True, False, "nope"),
    ("", "log_level", None, "info", 42),
    ("fp16", "enabled", False, True, "maybe"),
    ("fp16", "auto_cast", False, True, "maybe"),
    ("fp16", "loss_scale", 0, 128, -1),
    ("fp16", "initial_scale_power", 16, 12, "x"),
    ("fp16", "loss_scale_window", 1000, 500, -5),
    ("fp16", "hysteresis", 2, 4, "x"),
    ("fp16", "consecutive_hysteresis", False, True, "maybe"),
    ("fp16", "min_loss_scale", 1, 2, 0.5),
    ("fp16", "fp16_master_weights_and_grads", False, True, "maybe"),
    ("bf16", "enabled", False, True, "maybe"),
    ("bf16", "immediate_grad_update", False, True, "maybe"),
    ("bf16", "check_grad_overflow", True, False, "maybe"),
    ("bf16", "bf16_master_weights_and_grads", False, True, "maybe"),
    ("bf16", "bf16_optimizer_states", False, True, "maybe"),
    ("torch_autocast", "enabled", False, True, "maybe"),
    ("torch_autocast", "dtype", None, "torch.bfloat16", "float3"),
    ("torch_autocast", "lower_precision_safe_modules", None, ["torch.nn.Linear"], 3),
    ("zero_optimization", "stage", 0, 2, 4),
    ("zero_optimization", "contiguous_gradients", True, False, "maybe"),
    ("zero_optimization", "reduce_scatter", True, False, "maybe"),
    ("zero_optimization", "reduce_bucket_size", 500_000_000, 200_000_000, -1),
    ("zero_optimization", "use_multi_rank_bucket_allreduce", True, False, "maybe"),
    ("zero_optimization", "allgather_partitions", True, False, "maybe"),
    ("zero_optimization", "allgather_bucket_size", 500_000_000, 200_000_000, -1),
    ("zero_optimization", "overlap_comm", None, True, "maybe"),
    ("zero_optimization", "compute_grad_norm", True, False, "maybe"),
    ("zero_optimization", "load_from_fp32_weights", True, False, "maybe"),
    ("zero_optimization", "elastic_checkpoint", False, True, "maybe"),
    ("zero_optimization", "sub_group_size", 1_000_000_000, 100_000_000, -1),
    ("zero_optimization", "cpu_offload", None, True, "maybe"),
    ("zero_optimization", "cpu_offload_param", None, True, "maybe"),
    ("zero_optimization", "cpu_offload_use_pin_memory", None, True, "maybe"),
    ("zero_optimization", "stage3_prefetch_bucket_size", 50_000_000, 5_000_000, -1),
    ("zero_optimization", "stage3_param_persistence_threshold", 100_000, 10_000, -1),
    ("zero_optimization", "stage3_model_persistence_threshold", 9223372036854775807, 1_000_000, -1),
    ("zero_optimization", "stage3_max_live_parameters", 1_000_000_000, 100_000_000, -1),
    ("zero_optimization", "stage3_max_reuse_distance", 1_000_000_000, 100_000_000, -1),
    ("zero_optimization", "stage3_gather_16bit_weights_on_model_save", False, True, "maybe"),
    ("zero_optimization", "stage3_gather_fp16_weights_on_model_save", False, True, "maybe"),
    ("zero_optimization", "stage3_module_granularity_threshold", 0, 10_000, -1),
    ("zero_optimization", "stage3_use_all_reduce_for_fetch_params", False, True, "maybe"),
    ("zero_optimization", "stage3_allgather_sequential", False, True, "maybe"),
    ("zero_optimization", "prefetch_bucket_size", 50_000_000, 5_000_000, -1),
    ("zero_optimization", "param_persistence_threshold", 100_000, 10_000, -1),
    ("zero_optimization", "max_live_parameters", 1_000_000_000, 100_000_000, -1),
    ("zero_optimization", "ignore_unused_parameters", True, False, "maybe"),
    ("zero_optimization", "legacy_stage1", False, True, "maybe"),
    ("zero_optimization", "round_robin_gradients", False, True, "maybe"),
    ("zero_optimization", "parameter_alignment", False, True, "maybe"),
    ("zero_optimization", "zero_hpz_partition_size", 1, 2, 0),
    ("zero_optimization", "zero_quantized_weights", False, True, "maybe"),
    ("zero_optimization", "zero_quantized_nontrainable_weights", False, True, "maybe"),
    ("zero_optimization", "zero_quantized_gradients", False, True, "maybe"),
    ("zero_optimization", "memory_efficient_linear", True, False, "maybe"),
    ("zero_optimization", "pipeline_loading_checkpoint", False, True, "maybe"),
    ("zero_optimization", "override_module_apply", True, False, "maybe"),
    ("zero_optimization", "log_trace_cache_warnings", False, True, "maybe"),
    ("zero_optimization", "enable_sanity_checks", False, True, "maybe"),
    ("zero_optimization", "leaf_module", {}, {"names": ["MoE"]}, "MoE"),
    ("zero_optimization.offload_optimizer", "device", "none", "cpu", "gpu"),
    ("zero_optimization.offload_optimizer", "nvme_path", None, "/local_nvme", 7),
    ("zero_optimization.offload_optimizer", "buffer_count", 4, 8, -1),
    ("zero_optimization.offload_optimizer", "pin_memory", True, False, "maybe"),
    ("zero_optimization.offload_optimizer", "pipeline_read", False, True, "maybe"),
    ("zero_optimization.offload_optimizer", "pipeline_write", False, True, "maybe"),
    ("zero_optimization.offload_optimizer", "fast_init", False, True, "maybe"),
    ("zero_optimization.offload_optimizer", "ratio", 1.0, 0.3, 1.5),
    ("zero_optimization.offload_optimizer", "super_offload", False, True, "maybe"),
    ("zero_optimization.offload_optimizer", "cpuadam_cores_perc", 0.8, 0.5, "most"),
    ("zero_optimization.offload_param", "device", "none", "cpu", "gpu"),
    ("zero_optimization.offload_param", "nvme_path", None, "/local_nvme", 7),
    ("zero_optimization.offload_param", "buffer_count", 5, 8, -1),
    ("zero_optimization.offload_param", "buffer_size", 100_000_000, 200_000_000, -1),
    ("zero_optimization.offload_param", "max_in_cpu", 1_000_000_000, 100_000_000, -1),
    ("zero_optimization.offload_param", "pin_memory", True, False, "maybe"),
    ("activation_checkpointing", "partition_activations", False, True, "maybe"),
    ("activation_checkpointing", "number_checkpoints", None, 4, "four"),
    ("activation_checkpointing", "contiguous_memory_optimization", False, True, "maybe"),
    ("activation_checkpointing", "synchronize_checkpoint_boundary", False, True, "maybe"),
    ("activation_checkpointing", "profile", False, True, "maybe"),
    ("activation_checkpointing", "cpu_checkpointing", False, True, "maybe"),
    ("flops_profiler", "enabled", False, True, "maybe"),
    ("flops_profiler", "recompute_fwd_factor", 0.0, 1.0, "one"),
    ("flops_profiler", "profile_step", 1, 5, "five"),
    ("flops_profiler", "module_depth", -1, 2, "deep"),
    ("flops_profiler", "top_modules", 1, 3, "three"),
    ("flops_profiler", "detailed", True, False, "maybe"),
    ("flops_profiler", "output_file", None, "flops.txt", 7),
    *[(m, k, d, t, b) for m in ("tensorboard", "csv_monitor") for k, d, t, b in (
        ("enabled", False, True, "maybe"), ("output_path", "", "logs/", 7),
        ("job_name", "DeepSpeedJobName", "run1", 7))],
    ("wandb", "enabled", False, True, "maybe"),
    ("wandb", "group", None, "ablation", 7),
    ("wandb", "team", None, "lab", 7),
    ("wandb", "project", "deepspeed", "gpt", 7),
    ("comet", "enabled", False, True, "maybe"),
    ("comet", "samples_log_interval", 100, 10, "often"),
    ("comet", "project", None, "gpt", 7),
    ("comet", "workspace", None, "lab", 7),
    ("comet", "experiment_name", None, "run1", 7),
    ("comet", "online", None, False, "maybe"),
    ("comet", "mode", None, "get_or_create", 7),
    ("comms_logger", "enabled", False, True, "maybe"),
    ("comms_logger", "prof_all", True, False, "maybe"),
    ("comms_logger", "prof_ops", [], ["all_reduce"], "all_reduce"),
    ("comms_logger", "verbose", False, True, "maybe"),
    ("comms_logger", "debug", False, True, "maybe"),
    ("aio", "block_size", 1048576, 262144, "big"),
    ("aio", "queue_depth", 8, 16, "deep"),
    ("aio", "intra_op_parallelism", 1, 4, "many"),
    ("aio", "single_submit", False, True, "maybe"),
    ("aio", "overlap_events", True, False, "maybe"),
    ("aio", "use_gds", False, True, "maybe"),
    ("checkpoint", "tag_validation", "Warn", "Fail", "Loud"),
    ("checkpoint", "load_universal", False, True, "maybe"),
    ("checkpoint", "use_node_local_storage", False, True, "maybe"),
    ("checkpoint", "parallel_write", {"pipeline_stage": False}, {"pipeline_stage": True}, "yes"),
    ("data_types", "grad_accum_dtype", None, "fp32", "int3"),
    ("data_types", "keep_in_fp32_modules", "auto", ["norm"], 3),
    ("pipeline", "stages", "auto", 2, "many"),
    ("pipeline", "partition", "best", "uniform", 3),
    ("pipeline", "activation_checkpoint_interval", 0, 1, "often"),
    ("compile", "deepcompile", False, True, "maybe"),
    ("timers", "throughput", {"enabled": True, "synchronized": True}, {"enabled": False}, "on"),
]
# Where a key means something only beside another: fp16's scaler with fp16 on, stage 3's knobs
# at stage 3, an offload section at a stage that offloads it, master weights under ZeRO.
CONTEXT = {"fp16": FP16, "bf16": BF16, "zero_optimization.offload_optimizer": S2,
           "zero_optimization.offload_param": S3}
ZERO_STAGE3 = ("stage3_", "prefetch", "param_persistence", "max_live", "zero_hpz", "zero_quantized",
               "memory_efficient", "pipeline_loading", "override_module", "log_trace", "enable_sanity",
               "leaf_module", "sub_group", "cpu_offload_param", "model_persistence", "max_reuse")
# A misspelling per section a user edits most (DeepSpeed ignores an unknown key there).
UNKNOWN = [("", "train_batch"), ("", "gradient_clip"), ("", "fp_16"), ("fp16", "initial_loss_scale"),
           ("bf16", "enable"), ("zero_optimization", "stage3_prefetch_bucket"),
           ("zero_optimization", "offload_optimiser"), ("zero_optimization.offload_optimizer", "pin_memmory"),
           ("activation_checkpointing", "partition_activation"), ("tensorboard", "outputpath"),
           ("flops_profiler", "enable"), ("optimizer", "param")]

# DeepSpeed's own optimizers (any case) and torch.optim's (exact name), each with the params a
# user gives it; a key per param of the four minitron builds is tried too (OPTIMIZER_KEYS).
OPTIMIZER_TYPES = {"Adam": {"lr": 1e-4}, "AdamW": {"lr": 1e-4, "weight_decay": 0.01}, "adam": {"lr": 1e-4},
                   "ADAMW": {"lr": 1e-4}, "Lamb": {"lr": 1e-3}, "Adagrad": {"lr": 1e-2}, "Lion": {"lr": 1e-4},
                   "MuAdam": {"lr": 1e-4}, "Muon": {"lr": 1e-3}, "SGD": {"lr": 0.1, "momentum": 0.9},
                   "RMSprop": {"lr": 1e-3}, "Adamax": {"lr": 1e-3}, "NAdam": {"lr": 1e-3}, "RAdam": {"lr": 1e-3},
                   "Adadelta": {"lr": 1.0}, "ASGD": {"lr": 1e-2}, "Rprop": {"lr": 1e-2}, "sgd": {"lr": 0.1},
                   "OneBitAdam": {"lr": 1e-4}, "Sophia": {"lr": 1e-4}}
OPTIMIZER_KEYS = {
    "AdamW": [("lr", 0.001, 3e-4, "fast"), ("betas", [0.9, 0.999], [0.9, 0.95], [0.9]), ("eps", 1e-8, 1e-6, "tiny"),
              ("weight_decay", 0.0, 0.1, "some"), ("adam_w_mode", True, False, "maybe"),
              ("torch_adam", False, True, "maybe"), ("bias_correction", True, False, "maybe"),
              ("amsgrad", False, True, "maybe"), ("max_grad_norm", 0.0, 1.0, "one")],
    "Lamb": [("bias_correction", True, False, "maybe"), ("eps_inside_sqrt", False, True, "maybe"),
             ("max_coeff", 10.0, 5.0, "big"), ("min_coeff", 0.01, 0.05, "small")],
    "SGD": [("momentum", 0.0, 0.9, "some"), ("dampening", 0.0, 0.1, "some"), ("nesterov", False, True, "maybe"),
            ("maximize", False, True, "maybe"), ("weight_decay", 0.0, 0.01, "some")],
}
_WARMUP = [("warmup_min_lr", 0.0, 1e-5, "low"), ("warmup_max_lr", 0.001, 3e-4, "high"),
           ("warmup_num_steps", 1000, 100, "many"), ("warmup_type", "log", "linear", "cubic")]
SCHEDULERS = {
    "WarmupLR": ({"warmup_num_steps": 10}, _WARMUP),
    "WarmupDecayLR": ({"total_num_steps": 100}, _WARMUP + [("total_num_steps", 1000, 5000, "all")]),
    "WarmupCosineLR": ({"total_num_steps": 100}, [("warmup_min_ratio", 0.0, 0.01, "low"),
                                                  ("cos_min_ratio", 0.0001, 0.1, "low"),
                                                  ("warmup_num_steps", 1000, 100, "many")]),
    "OneCycle": ({"cycle_min_lr": 1e-5, "cycle_max_lr": 1e-3}, [
        ("cycle_first_step_size", 2000, 100, "long"), ("cycle_second_step_size", None, 200, "long"),
        ("cycle_first_stair_count", 0, 4, "some"), ("decay_step_size", 0, 10, "some"),
        ("decay_lr_rate", 0.0, 0.001, "fast"), ("cycle_momentum", True, False, "maybe"),
        ("cycle_min_mom", 0.8, 0.85, "low"), ("cycle_max_mom", 0.9, 0.95, "high"), ("decay_mom_rate", 0.0, 0.01, "x")]),
    "LRRangeTest": ({}, [("lr_range_test_min_lr", 0.001, 1e-5, "low"), ("lr_range_test_step_size", 2000, 100, "x"),
                         ("lr_range_test_step_rate", 1.0, 2.0, "x"), ("lr_range_test_staircase", False, True, "x")]),
    # torch.optim.lr_scheduler's, which DeepSpeed's engine takes by name when lr_schedules has none
    "StepLR": ({"step_size": 10}, []), "CosineAnnealingLR": ({"T_max": 100}, []),
    "ExponentialLR": ({"gamma": 0.99}, []), "LinearLR": ({"start_factor": 0.1, "total_iters": 10}, []),
    "MultiStepLR": ({"milestones": [10, 20]}, []), "PolynomialLR": ({"total_iters": 100}, []),
    "warmuplr": ({}, []), "Cosine": ({}, []),
}
WRAPPED = {"ZeRO-1": {"zero_optimization": {"stage": 1}}, "fp16": {"fp16": {"enabled": True}},
           "bf16": {"bf16": {"enabled": True}}}


def _merge(into: dict, extra: dict) -> dict:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


def _nest(section: str, key: str, value) -> dict:
    out = {key: value}
    for part in reversed(section.split(".")) if section else ():
        out = {part: out}
    return out


def _context(section: str, key: str) -> dict:
    out = copy.deepcopy(CONTEXT.get(section, {}))
    if section == "zero_optimization" and key.startswith(ZERO_STAGE3):
        return _merge(out, S3)
    if key.endswith("master_weights_and_grads") or key == "bf16_optimizer_states":
        _merge(out, S1)
        return _merge(out, {"bf16": {"bf16_master_weights_and_grads": True}} if key == "bf16_optimizer_states" else {})
    if section == "zero_optimization" and key == "compute_grad_norm":   # false needs clipping off
        return _merge(_merge(out, S2), {"gradient_clipping": 0.0})
    if section == "zero_optimization" and key != "stage":
        return _merge(out, S2)
    return out


def _config(*parts: dict) -> dict:
    out = copy.deepcopy(BASE)
    for part in parts:
        _merge(out, part)
    return out


def keys_battery():
    for section, key, *values in KEYS:
        for kind, value in zip(("default", "typical", "bad"), values):
            where = f"{section}.{key}" if section else key
            yield f"{where}={kind}", kind, _config(_context(section, key), _nest(section, key, value))
    for section, key in UNKNOWN:
        yield f"{section or 'top'}.{key}=unknown", "unknown", _config(CONTEXT.get(section, {}), _nest(section, key, 1))


def triad_battery():
    values = {"train_batch_size": (8, 6, 0), "train_micro_batch_size_per_gpu": (2, 3, 0),
              "gradient_accumulation_steps": (2, 0)}
    names = list(values)
    for given in itertools.product((False, True), repeat=3):
        chosen = [n for n, g in zip(names, given) if g]
        for combo in itertools.product(*(values[n] for n in chosen)):
            config = dict(zip(chosen, combo))
            yield "triad " + (",".join(f"{n.split('_')[1][:5]}={v}" for n, v in config.items()) or "none"), "triad", config
    for label, value in (("string", "8"), ("float", 8.0), ("bool", True), ("null", None), ("list", [8])):
        yield f"triad train_batch_size as {label}", "triad", {"train_batch_size": value}


def types_battery():
    for name, params in OPTIMIZER_TYPES.items():
        yield f"optimizer.type={name}", "type", _config({"optimizer": {"type": name, "params": params}})
    for name, rows in OPTIMIZER_KEYS.items():
        for key, *values in rows:
            for kind, value in zip(("default", "typical", "bad"), values):
                params = {**OPTIMIZER_TYPES[name], key: value}
                yield f"optimizer[{name}].{key}={kind}", kind, _config({"optimizer": {"type": name, "params": params}})
    for name, (params, rows) in SCHEDULERS.items():
        yield f"scheduler.type={name}", "type", _config({"scheduler": {"type": name, "params": params}})
        for key, *values in rows:
            for kind, value in zip(("default", "typical", "bad"), values):
                sched = {"type": name, "params": {**params, key: value}}
                yield f"scheduler[{name}].{key}={kind}", kind, _config({"scheduler": sched})
    # where DeepSpeed's engine wraps the optimizer (ZeRO, fp16, bf16), a torch schedule gets the
    # wrapper and torch refuses it; ZeRO refuses an optimizer it has not tested unless told to
    for label, where in WRAPPED.items():
        yield f"scheduler.type=StepLR with {label}", "type", _config(
            where, {"scheduler": {"type": "StepLR", "params": SCHEDULERS["StepLR"][0]}})
    yield "optimizer.type=RMSprop with ZeRO-1", "type", _config(
        WRAPPED["ZeRO-1"], {"optimizer": {"type": "RMSprop", "params": OPTIMIZER_TYPES["RMSprop"]}})


def battery() -> list[tuple[str, str, dict]]:
    """(name, kind, config) for every config, full ones (ds_config_full.py) last."""
    from ds_config_full import full_battery   # beside this file
    return [*keys_battery(), *triad_battery(), *types_battery(), *full_battery()]
