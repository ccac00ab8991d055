"""--deepspeed-activation-checkpointing against the ds_config's ``activation_checkpointing`` section
and the recomputation flags, checked before any rank starts (torch-free).

Megatron-DeepSpeed reads the DeepSpeed checkpoint's settings only when the flag is given; the
engine never reads the section. So a section that asks for something without the flag would
promise what the run does not do, and the flag without Megatron's full recomputation would
configure a checkpoint no layer calls: both are refused. What the section leaves open,
number_checkpoints, is this rank's count of checkpointed chunks, as Megatron-DeepSpeed passes
ceil(layers / layers per checkpoint).
"""

from __future__ import annotations

from minitron.runtime.activation_checkpointing.config import DEFAULTS
from minitron.training.argument_groups import ArgumentError


def checkpoints_per_forward(args) -> int:
    """How many chunks one forward checkpoints: uniform, ceil(layers / N); block, the first N layers
    one by one. (--deepspeed runs without a pipeline when it recomputes: all layers are here.)"""
    layers, n = args.num_layers, args.recompute_num_layers
    return -(-layers // n) if args.recompute_method == "uniform" else min(n, layers)


def validate_activation_checkpointing(args, section: dict, path) -> None:
    asked = sorted(key for key, default in DEFAULTS.items() if section[key] != default)
    if not args.deepspeed_activation_checkpointing:
        if asked:
            raise ArgumentError(f"--deepspeed-config {path}: activation_checkpointing sets {', '.join(asked)}, which "
                                "only deepspeed.checkpointing reads, configured by --deepspeed-activation-"
                                "checkpointing: add the flag, or drop the section")
        return
    if args.recompute_granularity != "full":
        raise ArgumentError("--deepspeed-activation-checkpointing replaces the checkpoint of Megatron's full "
                            "recomputation, which this run does not use: add --recompute-granularity full "
                            "--recompute-method uniform --recompute-num-layers 1, or drop the flag")
    needed, given = checkpoints_per_forward(args), section["number_checkpoints"]
    if section["contiguous_memory_optimization"] and given is not None and given < needed:
        raise ArgumentError(f"--deepspeed-config {path}: activation_checkpointing.number_checkpoints {given} is fewer "
                            f"than the {needed} chunks one forward checkpoints here, and the contiguous buffers "
                            f"hold one each: give at least {needed}, or leave it out (minitron counts them)")
