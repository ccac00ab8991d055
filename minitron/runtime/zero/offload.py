"""ZeRO-Offload: which of a ZeRO optimizer's tensors live in host memory, and the copies that
cross between host and device each step (DeepSpeed's ``cpu_offload`` paths in
``zero/stage_1_and_2.py`` and ``offload_optimizer`` / ``offload_param`` in ``zero/stage3.py``).

With ``offload_optimizer`` the rank's fp32 master partition and the optimizer's moments are host
tensors and the optimizer steps there (CPU-Adam: ops/adam/cpu_adam.py). Each step then moves:

    device -> host   my partition of the reduced gradient, made fp32 on the device first
                     (DeepSpeed's async_inplace_copy_grad_to_fp32_buffer_from_gpu): 4 bytes
                     an element
    host -> device   the updated master, cast on the host into a bit16 buffer and copied
                     into my partition of the device's flat parameters: the weights' bytes

With ``offload_param`` (stage 3) a rank's parameter pieces are host tensors too: every gather
first copies my pieces host -> device, then all-gathers them on the device; a master that is
also on the host updates them where they are, with nothing crossing.

On a CPU rank host and device are the same memory: every tensor is made, and every copy runs,
as on a GPU, and the trace names each crossing with its bytes (``copy_gradients_to_host``,
``copy_params_to_device``, ``copy_params_to_host``), so what a GPU would move is visible where
nothing moves. On CUDA (minitron's accelerator says which) the host tensors are really in host
memory, page-locked when ``pin_memory`` says so.
"""

from __future__ import annotations

from typing import Optional

import torch

from minitron.runtime.zero.offload_config import OffloadConfig, offloaded
from minitron.trace import traced


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class ZeroOffload:
    """One ZeRO optimizer's offload: ``optimizer`` and ``param`` say what lives on the host."""

    def __init__(self, offload_optimizer: Optional[OffloadConfig], offload_param: Optional[OffloadConfig],
                 device: torch.device):
        self.optimizer, self.param = offloaded(offload_optimizer), offloaded(offload_param)
        self.optimizer_config, self.param_config = offload_optimizer, offload_param
        self.device, self.host = device, torch.device("cpu")
        # Page-locked memory is a CUDA driver's: a CPU rank has nothing to lock it against.
        pin = any(c is not None and offloaded(c) and c.pin_memory for c in (offload_optimizer, offload_param))
        self.pin = pin and device.type == "cuda"

    def host_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A host copy of ``t`` (pinned where asked and possible), its own storage."""
        out = t.detach().to(self.host, copy=True)
        return out.pin_memory() if self.pin else out

    @traced(args=lambda self, grad, group: {"group": group, "bytes": grad.numel() * 4, "from": str(grad.device),
                                            "to": "host"})
    def copy_gradients_to_host(self, grad: torch.Tensor, group: int) -> torch.Tensor:
        """My partition of the reduced gradient, fp32, on the host: what the host optimizer steps."""
        return self.host_tensor(grad.float())

    @traced(args=lambda self, values, dest, group: {"group": group, "bytes": dest.numel() * dest.element_size(),
                                                    "from": "host", "to": str(dest.device)})
    def copy_params_to_device(self, values: torch.Tensor, dest: torch.Tensor, group: int) -> None:
        """Host values (the updated master, or my parameter pieces) into a device tensor, cast to
        its dtype on the host first, so only the weights' bytes cross (DeepSpeed's
        param_buffer_of_bit16_for_cpu_offload_groups)."""
        staged = values.to(dest.dtype)
        dest.copy_(staged.pin_memory() if self.pin else staged)

    @traced(args=lambda self, values, dest, group: {"group": group, "bytes": dest.numel() * dest.element_size(),
                                                    "from": str(values.device), "to": "host"})
    def copy_params_to_host(self, values: torch.Tensor, dest: torch.Tensor, group: int) -> None:
        """A master kept on the device (offload_param without offload_optimizer) into my host
        parameter pieces."""
        dest.copy_(values.to(dest.dtype))

    def fetch(self, pieces: torch.Tensor, group: int) -> torch.Tensor:
        """Stage 3's gather, first move: my pieces on the device (a copy across under offload_param)."""
        if not self.param:
            return pieces
        out = torch.empty(pieces.shape, dtype=pieces.dtype, device=self.device)
        self.copy_params_to_device(pieces, out, group)
        return out

    def publish(self, master: torch.Tensor, dest: torch.Tensor, group: int, dest_on_host: bool = False) -> None:
        """The updated master into the parameters' partition, across if they live apart."""
        if self.optimizer and not dest_on_host:
            self.copy_params_to_device(master, dest, group)
        elif dest_on_host and not self.optimizer:
            self.copy_params_to_host(master, dest, group)
        else:
            dest.copy_(master)


def state_bytes(optimizer: torch.optim.Optimizer, masters: list) -> int:
    """The masters and the optimizer's per-element states (moments; not the step count)."""
    total = 0
    for master in masters:
        total += _bytes(master)
        for value in optimizer.state.get(master, {}).values():
            if torch.is_tensor(value) and value.numel() == master.numel():
                total += _bytes(value)
    return total
