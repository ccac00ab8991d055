"""Which device and which communication backend: DeepSpeed's accelerator abstraction, small."""

from minitron.accelerator.real_accelerator import get_accelerator, set_accelerator, set_accelerator_for_backend

__all__ = ["get_accelerator", "set_accelerator", "set_accelerator_for_backend"]
