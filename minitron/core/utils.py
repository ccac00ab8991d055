"""Small helpers shared across core: the named scratch buffer that layers borrow, and DTensor helpers.

Megatron keeps this in ``megatron/core/utils.py``; ``parallel_state`` owns the one instance.
"""

from __future__ import annotations

import math
import sys

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


# --- DTensors (torch's FSDP2 parameters and gradients, --use-torch-fsdp2) ------------------------
# Asked without importing torch.distributed.tensor (seconds of imports here): until something has
# loaded it, no tensor can be a DTensor.
def _dtensor_type():
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def to_local_if_dtensor(tensor):
    """This rank's part of a DTensor (a view of it: in-place edits reach the DTensor); else the tensor."""
    dtensor = _dtensor_type()
    return tensor.to_local() if dtensor is not None and isinstance(tensor, dtensor) else tensor


def get_data_parallel_group_if_dtensor(tensor, data_parallel_group=None):
    """The group a DTensor is cut over (FSDP2's data-parallel group), else ``data_parallel_group``."""
    dtensor = _dtensor_type()
    if dtensor is not None and isinstance(tensor, dtensor):
        return tensor.device_mesh.get_group()
    return data_parallel_group
