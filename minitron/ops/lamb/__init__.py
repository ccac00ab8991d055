"""``deepspeed.ops.lamb``: FusedLamb, the optimizer a ds_config's "Lamb" builds."""

from minitron.ops.lamb.fused_lamb import FusedLamb

__all__ = ["FusedLamb"]
