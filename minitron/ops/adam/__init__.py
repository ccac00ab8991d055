"""``deepspeed.ops.adam``: FusedAdam, the optimizer a ds_config's "Adam" or "AdamW" builds."""

from minitron.ops.adam.fused_adam import FusedAdam

__all__ = ["FusedAdam"]
