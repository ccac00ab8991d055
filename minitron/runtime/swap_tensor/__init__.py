"""ZeRO-Infinity's swapping to NVMe: DeepSpeed's ``runtime/swap_tensor/`` (the aio section, the
optimizer swapper), small. Plain file I/O; what DeepSpeed's async I/O adds is in aio_config.py."""
