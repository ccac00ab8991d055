"""``deepspeed.ops.lion``: what a ds_config's "Lion" builds (FusedLion, or DeepSpeedCPULion under
ZeRO-Offload), one arithmetic in plain torch."""

from minitron.ops.lion.cpu_lion import DeepSpeedCPULion, FusedLion

__all__ = ["DeepSpeedCPULion", "FusedLion"]
