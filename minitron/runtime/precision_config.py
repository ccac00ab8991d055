"""The fp16 and bf16 sections' options beyond ``enabled`` and the loss scale (DeepSpeed 0.19.8's
runtime/precision_config.py), each where DeepSpeed reads it and what it changes there:

    bf16.check_grad_overflow (true)     read by the engine for ZeRO stages 1 and 2 only: with bf16,
                                        false drops the Inf/NaN check before the step, so a
                                        non-finite gradient is stepped into the weights instead of
                                        skipping the step. (fp16 always checks; stages 0 and 3 do
                                        not read it.) Implemented: zero/stage_1_and_2.py.
    bf16.immediate_grad_update (false)  read by BF16_Optimizer only, which 0.19.8 builds for bf16
                                        under the PipelineEngine or at stage 1 with fp32 gradient
                                        accumulation (data_types); true adds each bf16 gradient
                                        into its fp32 copy from a hook as soon as backward makes it
                                        and frees the bf16 one. Same sums, held for less time: it
                                        changes memory, not numbers. Implemented for stage 1
                                        (runtime/bf16_optimizer.py); minitron's PipelineEngine
                                        does not build BF16_Optimizer, and elsewhere nothing reads it.
    fp16.auto_cast (false)              the engine's forward casts every floating input (in lists,
                                        tuples, dicts too) to fp16 before the module sees it, fp16
                                        enabled or not. Implemented: engine.py.
    bf16.bf16_master_weights_and_grads, fp16.fp16_master_weights_and_grads (false)
                                        ZeRO keeps its master weights and gradients in 16 bits
                                        instead of fp32. DeepSpeed asserts ZeRO stage 1-3 and,
                                        with fp32 optimizer states, ZeRO-Offload with DeepSpeedCPUAdam
                                        (the CPU Adam updates 16-bit masters); refused here with
                                        those reasons, and where DeepSpeed would run it, because
                                        minitron's offloaded optimizer keeps fp32 masters.
    bf16.bf16_optimizer_states (false)  with bf16 master weights, the optimizer's moments in bf16
                                        too, so ZeRO 1-3 keep them on the device without
                                        ZeRO-Offload. DeepSpeed asserts ZeRO stage 1-3 and
                                        bf16_master_weights_and_grads; refused here after those,
                                        because it needs the 16-bit masters above: ZeRO's
                                        masters, its checkpoints' fp32 groups and the universal
                                        conversion would all change dtype.
"""

from __future__ import annotations

from minitron.runtime.config_values import DeepSpeedConfigError, model_flag, model_view

BF16_OPTIONS = {"immediate_grad_update": False, "check_grad_overflow": True, "bf16_master_weights_and_grads": False,
                "bf16_optimizer_states": False}
FP16_OPTIONS = {"auto_cast": False, "fp16_master_weights_and_grads": False}


def parse_precision_options(params: dict) -> dict:
    """The five options, DeepSpeed's defaults filled in (pydantic's lax bools: "true", 1 ...)."""
    bf16_key = "bf16" if "bf16" in params else "bfloat16"
    fp16, bf16 = model_view(params.get("fp16", {})), model_view(params.get(bf16_key, {}))
    options = {key: model_flag(fp16, key, default, "fp16") for key, default in FP16_OPTIONS.items()}
    options.update({key: model_flag(bf16, key, default, bf16_key) for key, default in BF16_OPTIONS.items()})
    return options


def check_master_weights(options: dict, stage: int, offload_optimizer) -> None:
    """DeepSpeed's refusals of 16-bit master weights in its order (its config's sanity check on
    the stage, then the ZeRO optimizer's on the pair and the offload), and minitron's where
    DeepSpeed would go on."""
    if options["bf16_optimizer_states"]:   # DeepSpeed's config sanity check, then minitron's reason
        if stage == 0:
            raise DeepSpeedConfigError("bf16.bf16_optimizer_states: DeepSpeed supports it only with ZeRO stage 1, 2 "
                                       "or 3; set zero_optimization.stage, or drop the key")
        if not options["bf16_master_weights_and_grads"]:
            raise DeepSpeedConfigError("bf16.bf16_optimizer_states requires bf16.bf16_master_weights_and_grads "
                                       "(DeepSpeed asserts it); add it, or drop the key")
        raise DeepSpeedConfigError("bf16.bf16_optimizer_states: bf16 optimizer states sit on bf16 master weights, "
                                   "which minitron's ZeRO does not build (its masters, checkpoints and universal "
                                   "conversion are fp32); drop the key")
    asked = [(section, key) for section, key in (("fp16", "fp16_master_weights_and_grads"),
                                                 ("bf16", "bf16_master_weights_and_grads")) if options[key]]
    if not asked:
        return
    section, key = asked[0]
    if stage == 0:
        raise DeepSpeedConfigError(f"{section}.{key}: DeepSpeed supports 16-bit master weights only with ZeRO "
                                   "stage 1, 2 or 3; set zero_optimization.stage, or drop the key")
    if len(asked) == 2:
        raise DeepSpeedConfigError("fp16_master_weights_and_grads and bf16_master_weights_and_grads exclude "
                                   "each other (DeepSpeed asserts it): keep one")
    if offload_optimizer is None:
        raise DeepSpeedConfigError(f"{section}.{key}: DeepSpeed requires ZeRO-Offload with DeepSpeedCPUAdam for "
                                   "16-bit master weights (its CPU Adam updates them); add "
                                   "zero_optimization.offload_optimizer, or drop the key")
    raise DeepSpeedConfigError(f"{section}.{key}: minitron's offloaded optimizer keeps fp32 master weights; "
                               "16-bit ones are not built here: drop the key")
