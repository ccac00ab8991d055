"""DeepSpeed's 1-bit optimizers (``runtime/fp16/onebit``): 1-bit Adam (adam.py)."""

from minitron.runtime.fp16.onebit.adam import OnebitAdam  # noqa: F401
