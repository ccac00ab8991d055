"""Four small ds_config sections of DeepSpeed 0.19.8 and the checkpoint section's keys, read as
DeepSpeed reads them (``runtime/config.py``, ``compile/config.py``, ``utils/config.py``):

    checkpoint.tag_validation ("Warn")   save_checkpoint compares the tag across ranks (a hash,
                                         all-reduced as max and min): "Warn" logs a mismatch,
                                         "Fail" refuses it, "Ignore" skips the check
                                         (checkpoint/engine_checkpoint.py)
    data_types.keep_in_fp32_modules      buffers whose names match stay fp32 when the model is
                                         cast to fp16/bf16 (runtime/keep_in_fp32.py)
    data_types.grad_accum_dtype          the dtype gradients accumulate in: the model's own (what
                                         runs anyway), or fp32 under bf16 at ZeRO stage 1 without
                                         CPU offload, DeepSpeed's BF16_Optimizer (runtime/
                                         bf16_optimizer.py); refused elsewhere
    timers.throughput                    DeepSpeed's ThroughputTimer: it prints samples/s every
                                         steps_per_print steps; accepted while it has nothing
                                         to print (NO_EFFECT says when)
    compile                              DeepCompile's knobs, read only by engine.compile()

``NO_EFFECT``: what a key does in DeepSpeed and why it changes nothing in minitron (printed by
``minitron ds-config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from minitron.runtime.config_engine import NO_EFFECT as ENGINE_NO_EFFECT
from minitron.runtime.config_pipeline import NO_EFFECT as PIPELINE_NO_EFFECT
from minitron.runtime.config_values import DeepSpeedConfigError, check_keys, json_value, model_flag, model_view

NO_EFFECT = {
    "zero_optimization.parameter_alignment": "pads each parameter of a ZeRO 1-2 flat group to a 16-byte "
                                             "boundary; at stages 0 and 3 no DeepSpeed code reads it (minitron "
                                             "refuses true at stages 1-2: zero/stage_1_and_2_config.py)",
    "compile": "DeepCompile's passes, which DeepSpeed applies only when the program calls engine.compile() "
               "(torch.compile of the engine); minitron's engine has no compile(), so a config that leaves "
               "deepcompile false changes nothing, there or here",
    "timers.throughput": "DeepSpeed's ThroughputTimer prints samples/s on rank 0 every steps_per_print "
                         "optimizer steps (never when steps_per_print is null, the default); minitron's engine "
                         "prints no steps_per_print lines, so there is no line for it to add to",
    "checkpoint.use_node_local_storage": "the save's writers become each node's local rank 0 instead of "
                                         "data-parallel rank 0, so every node writes its own copy to storage "
                                         "no other node sees; minitron's ranks share one machine's disk, where "
                                         "that is the same file written once per node",
    "checkpoint.parallel_write": "spreads a PipelineModule's layer files over the data-parallel ranks when "
                                 "it saves; minitron's PipelineEngine saves in the plain engine's layout (no "
                                 "layer_NN files), so there is nothing to spread",
    "zero_optimization.override_module_apply": "inside `with deepspeed.zero.Init()`, Module.apply gathers the "
                                               "partitioned parameters it visits; minitron has no zero.Init (the "
                                               "engine partitions a model built whole, as DeepSpeed's does without "
                                               "it), so there is no apply to override",
}
TAG_VALIDATION = ("IGNORE", "WARN", "FAIL")
# DeepSpeed's DtypeEnum: every spelling of each dtype
DTYPES = {"fp16": ("torch.float16", "fp16", "float16", "half"), "fp32": ("torch.float32", "fp32", "float32", "float"),
          "bf16": ("torch.bfloat16", "bf16", "bfloat16"), "int8": ("torch.int8", "int8")}
COMPILE_FLAGS = {"deepcompile": False, "autoep_non_moe": False, "free_activation": False, "offload_activation": False,
                 "offload_activation_pin_memory": True, "offload_opt_states": False, "double_buffer": True,
                 "symmetric_memory": False, "debug_log": False, "offload_parameters": False,
                 "sync_before_reduce": False, "sync_after_reduce": False, "sync_before_allgather": False,
                 "sync_after_allgather": False, "keep_int_input_tensors": True, "keep_all_input_tensors": False}


@dataclass
class Features:
    tag_validation: str = "WARN"
    use_node_local_storage: bool = False
    keep_in_fp32_modules: object = "auto"     # "auto" or a list of name patterns
    grad_accum_dtype: Optional[str] = None
    throughput_timer: dict = field(default_factory=lambda: {"enabled": True, "synchronized": True})


def no_effect_notes(params: dict) -> dict:
    """The keys this config gives that DeepSpeed acts on and minitron need not: key -> why."""
    notes = {key: why for key, why in ENGINE_NO_EFFECT.items() if key in params}
    for key, why in {**NO_EFFECT, **PIPELINE_NO_EFFECT}.items():
        section, _, inner = key.partition(".")
        given = params.get(section)
        if isinstance(given, dict) and given and (not inner or inner in given):
            notes[key] = why
    return notes


def _object(params: dict, key: str, where: str = "") -> dict:
    value = params.get(key, {})
    if not isinstance(value, dict):
        raise DeepSpeedConfigError(f"{where}{key} must be an object, got {json_value(value)}")
    return value


def _dtype(value, key: str) -> str:
    name = next((n for n, spellings in DTYPES.items() if value in spellings), None)
    if name is None:
        raise DeepSpeedConfigError(f"data_types.{key} must be one of fp32, fp16, bf16 (or torch.float32, ...), "
                                   f"got {json_value(value)}")
    return name


def parse_checkpoint_keys(checkpoint: dict) -> tuple[str, bool]:
    mode = checkpoint.get("tag_validation", "Warn")
    if not isinstance(mode, str) or mode.upper() not in TAG_VALIDATION:
        raise DeepSpeedConfigError(f"checkpoint.tag_validation must be \"Ignore\", \"Warn\" or \"Fail\", got "
                                   f"{json_value(mode)}")
    node_local = checkpoint.get("use_node_local_storage", False)
    if not isinstance(node_local, bool):
        raise DeepSpeedConfigError(f"checkpoint.use_node_local_storage must be true or false, got "
                                   f"{json_value(node_local)}")
    write = _object(checkpoint, "parallel_write", "checkpoint.")
    check_keys(write, ("pipeline_stage",), {}, "checkpoint.parallel_write")
    if write.get("pipeline_stage", False) not in (True, False):   # DeepSpeed: "expecting: true or false"
        raise DeepSpeedConfigError(f"checkpoint.parallel_write.pipeline_stage must be true or false, got "
                                   f"{json_value(write['pipeline_stage'])}")
    return mode.upper(), node_local


def parse_features(params: dict, checkpoint: dict, model_dtype: str, zero_config) -> Features:
    tag_validation, node_local = parse_checkpoint_keys(checkpoint)
    types = _object(params, "data_types")
    check_keys(types, ("grad_accum_dtype", "keep_in_fp32_modules"), {}, "data_types")
    keep = types.get("keep_in_fp32_modules", "auto")
    if keep != "auto" and not (isinstance(keep, list) and all(isinstance(n, str) for n in keep)):
        raise DeepSpeedConfigError(f"data_types.keep_in_fp32_modules must be \"auto\" or a list of name patterns, "
                                   f"got {json_value(keep)}")
    accum, zero_stage = types.get("grad_accum_dtype"), zero_config.stage
    if accum is not None:
        accum = _dtype(accum, "grad_accum_dtype")
        offload = zero_config.offload_optimizer is not None and zero_config.offload_optimizer.device == "cpu"
        if (model_dtype, accum, zero_stage, offload) == ("bf16", "fp32", 1, False):   # DeepSpeed's BF16_Optimizer
            if not zero_config.compute_grad_norm:   # its step needs the norm (DeepSpeed's ValueError)
                raise DeepSpeedConfigError("zero_optimization.compute_grad_norm false does not support ZeRO stage 1 "
                                           "with bf16 weights and fp32 gradient accumulation (DeepSpeed refuses it); "
                                           "drop one")
        elif accum != model_dtype:
            what = "an unsupported mix (DeepSpeed raises NotImplementedError) without ZeRO" if zero_stage == 0 else \
                "ZeRO's separate accumulation buffers (grad_accum)"
            raise DeepSpeedConfigError(f"data_types.grad_accum_dtype {accum} with {model_dtype} weights is {what}, "
                                       f"which minitron does not build; drop it (gradients accumulate in "
                                       f"{model_dtype}) or set it to {model_dtype}")
    timers = _object(params, "timers")
    check_keys(timers, ("throughput",), {}, "timers")
    throughput = model_view(_object(timers, "throughput", "timers."))
    check_keys(throughput, ("enabled", "synchronized"), {}, "timers.throughput", model=True)
    timer = {key: model_flag(throughput, key, True, "timers.throughput") for key in ("enabled", "synchronized")}
    compile_section = model_view(_object(params, "compile"))
    check_keys(compile_section, tuple(COMPILE_FLAGS) + ("free_activation_threshold", "passes"), {}, "compile",
               model=True)
    if model_flag(compile_section, "deepcompile", False, "compile"):
        raise DeepSpeedConfigError("compile.deepcompile: DeepCompile rewrites the graph torch.compile captures when "
                                   "the program calls engine.compile(), which minitron's engine does not have; "
                                   "set it to false")
    return Features(tag_validation, node_local, keep, accum, timer)
