"""Small helpers shared across core: for now, the named scratch buffer that layers borrow.

Megatron keeps this in ``megatron/core/utils.py``; ``parallel_state`` owns the one instance.
"""

from __future__ import annotations

import math

import torch

from minitron.accelerator import get_accelerator


class GlobalMemoryBuffer:
    """Named scratch tensors, allocated once and lent out again and again.

    A caller asks for a shape, a dtype and a name and gets a view into one flat allocation per
    (name, dtype, device), grown when a larger shape is asked for. Two callers that share a name
    share the memory, so a name may only be lent to one user at a time: whatever the borrower
    wrote is gone as soon as anyone asks for the same name again. Sequence parallelism's linear
    layers borrow "mpu" for the gathered sequence and give it back before they return.
    """

    def __init__(self) -> None:
        self.buffer: dict[tuple, torch.Tensor] = {}

    def get_tensor(self, tensor_shape, dtype: torch.dtype, name: str,
                   device: torch.device | str | None = None) -> torch.Tensor:
        """A tensor of ``tensor_shape`` (contents undefined) in the buffer called ``name``."""
        device = torch.device(get_accelerator().current_device_name() if device is None else device)
        needed = math.prod(tensor_shape)
        key = (name, dtype, device)
        held = self.buffer.get(key)
        if held is None or held.numel() < needed:
            # Grow to the largest request seen: later, smaller requests reuse the front of it.
            held = self.buffer[key] = torch.empty(needed, dtype=dtype, device=device, requires_grad=False)
        return held[:needed].view(*tensor_shape)
