"""ZeRO-R in the estimate: what --deepspeed-activation-checkpointing's partitioned checkpoints send.

With ``partition_activations`` each checkpoint keeps 1/tp of every floating input and, in its
backward, all-gathers the rest over the tensor-parallel group (runtime/activation_checkpointing):
per checkpoint and micro-batch, one gather of the hidden states (s x b x h in the model's dtype)
and, with rotary positions, one of the angle table ([s, 1, 1, rotary dim], fp32), each rank
handing its 1/tp. (--deepspeed refuses pipeline, context and sequence parallelism beside
recomputation, so s is the whole sequence and there is one model chunk.)
"""

from __future__ import annotations

from minitron.training.deepspeed_activation_arguments import checkpoints_per_forward
from minitron.training.theoretical_params import DTYPE_BYTES


def zero_r_sections(args) -> dict | None:
    """The activation_checkpointing section the run's checkpoints follow, or None when they are
    Megatron's own (no --deepspeed-activation-checkpointing)."""
    if not (getattr(args, "deepspeed", False) and getattr(args, "deepspeed_activation_checkpointing", False)):
        return None
    from minitron.training.theoretical_zero import ds_config   # read once per file (cached there)
    return ds_config(args).activation_checkpointing_config


def zero_r_gathers(args, tally, times: int) -> None:
    """The backward's gathers of partitioned checkpoint inputs, ``times`` micro-batches."""
    section, t = zero_r_sections(args), args.tensor_model_parallel_size
    if section is None or not section["partition_activations"] or t == 1:
        return
    checkpoints, s, b = checkpoints_per_forward(args), args.seq_length, args.micro_batch_size
    tally.add("tp", s * b * args.hidden_size * DTYPE_BYTES[args.params_dtype] // t, times * checkpoints)
    if getattr(args, "position_embedding_type", None) in ("rope", "yarn"):
        percent = getattr(args, "rotary_percent", 1.0)
        dim = args.kv_channels if percent >= 1.0 else int(args.kv_channels * percent)
        tally.add("tp", s * dim * 4 // t, times * checkpoints)
