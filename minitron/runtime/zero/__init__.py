"""ZeRO: stages 0-2 in stage_1_and_2.py (flat buffers cut into data-parallel partitions),
stage 3 in stage3.py (each parameter cut, gathered per module)."""

from minitron.runtime.zero.stage3 import register_external_parameter  # noqa: F401  (deepspeed.zero's name)
