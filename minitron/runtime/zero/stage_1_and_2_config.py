"""zero_optimization's keys for ZeRO stages 1 and 2, as DeepSpeed 0.19.8 reads them (the
fields in zero/config.py, the checks in its validators and in DeepSpeedZeroOptimizer's
constructor, which minitron makes before any rank starts):

    compute_grad_norm (true)   false: the step skips the global gradient norm and its
                               all-reduce (stage_1_and_2.py), and get_global_grad_norm() is None.
                               Stages 1-2 only; not with gradient_clipping (which needs the norm;
                               DeepSpeed's default is 1.0, so the config must say 0)
                               nor with offload_optimizer (DeepSpeed's CPU path always takes it)
    use_multi_rank_bucket_allreduce (true)
                               a gradient bucket is all-reduced whole (true) or reduced onto
                               each owning rank in turn (false): buckets.py
    load_from_fp32_weights (true)
                               false: a load takes the fp32 masters from the model's 16-bit
                               weights, not from the checkpoint's fp32 partitions
                               (checkpoint/zero_checkpoint.py; DeepSpeed's stage-3 loader, and
                               minitron's, ignore it)
    ignore_unused_parameters (true)
                               false, with offload_optimizer at stages 1-2: the step stops on a
                               parameter of the rank's partition that had no gradient (DeepSpeed
                               asserts where it sums the offloaded norm); read nowhere else
    elastic_checkpoint (false)  true: each rank's optimizer file holds its Adam moments lean (the
                               padding cut off, one dict per group) and the step apart, and a
                               load reads every rank's file, glues the partitions and takes its
                               own of the new layout (checkpoint/elastic_checkpoint.py). At
                               stage 3 DeepSpeed only warns that it is no longer supported
    parameter_alignment (false)
                               true: DeepSpeed starts every parameter of a flat group but the
                               last on a 16-byte boundary (8 elements of bf16/fp16, 4 of fp32),
                               padding between parameters. minitron refuses it at stages 1-2
                               (its flat buffer, buckets and checkpoint readers pack parameters
                               end to end); at stages 0 and 3 no DeepSpeed code reads it, and
                               neither does minitron's
    legacy_stage1 (false)      the ZeRO-1 of DeepSpeed before 0.5.9: DeepSpeed 0.19.8 raises at
                               initialize when a ZeRO stage is on, and reads it nowhere at
                               stage 0; minitron refuses it at once, there alike
"""

from __future__ import annotations

from minitron.runtime.config_values import DeepSpeedConfigError, model_flag

KNOB_KEYS = ("compute_grad_norm", "use_multi_rank_bucket_allreduce", "load_from_fp32_weights", "legacy_stage1",
             "ignore_unused_parameters", "elastic_checkpoint", "parameter_alignment")


def parse_stage_1_and_2(zero: dict, stage: int, params: dict, offload_optimizer, where: str) -> dict:
    """The knobs' values, by the ZeroConfig field they fill."""
    out = {"compute_grad_norm": model_flag(zero, "compute_grad_norm", True, where),
           "use_multi_rank_bucket_allreduce": model_flag(zero, "use_multi_rank_bucket_allreduce", True, where),
           "load_from_fp32_weights": model_flag(zero, "load_from_fp32_weights", True, where),
           "ignore_unused_parameters": model_flag(zero, "ignore_unused_parameters", True, where),
           "elastic_checkpoint": model_flag(zero, "elastic_checkpoint", False, where)}
    if model_flag(zero, "legacy_stage1", False, where) and stage > 0:
        raise DeepSpeedConfigError(f"{where}.legacy_stage1: the ZeRO stage 1 of DeepSpeed before 0.5.9, which "
                                   "0.19.8 refuses at initialize as well; remove it")
    if model_flag(zero, "parameter_alignment", False, where) and stage in (1, 2):
        raise DeepSpeedConfigError(
            f"{where}.parameter_alignment true pads each parameter of a ZeRO 1-2 flat group to a 16-byte boundary, "
            "which moves every parameter's offset, the partitions and the checkpoint's param_alignment_paddings; "
            "minitron packs parameters end to end and does not build that layout: remove the key")
    if not out["compute_grad_norm"]:
        why = ("is supported only with ZeRO stage 1 or 2" if stage not in (1, 2) else
               "requires gradient_clipping 0 (clipping needs the norm)" if _clips(params) else
               "does not support offload_optimizer" if offload_optimizer is not None
               and offload_optimizer.device != "none" else None)
        if why:   # DeepSpeed's own three refusals, here before any rank starts
            raise DeepSpeedConfigError(f"{where}.compute_grad_norm false {why}")
    return out


def _clips(params: dict) -> bool:
    # DeepSpeed's default is 1.0 (since 0.19.3): compute_grad_norm false needs an explicit 0
    clip = params.get("gradient_clipping", 1.0)   # (its own parser says what a bad value is)
    return isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip > 0
