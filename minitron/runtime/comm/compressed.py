"""1-bit Adam's compressed all-reduce: DeepSpeed's ``compressed_allreduce`` (``runtime/comm/nccl.py``
and ``compressed.py`` in 0.19.6, the last release that has them; 0.19.7 removed 1-bit Adam),
on torch.distributed, so it runs on gloo ranks as well.

Each rank holds a tensor (1-bit Adam's momentum) that the ranks want averaged. Instead of 32 bits
per element, each sends one sign bit and one fp32 scale per chunk, in two phases:

    worker  m += worker_error                        (what the last rounding lost comes back)
            scale = ||m|| / sqrt(numel(m))           (the root-mean-square: m's size, not its max)
            q = scale * sign(m)                      (sign(0) counts as +: one bit cannot say 0)
            worker_error = m - q
            cut the sign bits into `size` chunks; all-to-all: rank r receives every rank's chunk r,
            and all-gather the scales
    server  rank r adds up its chunk from every rank, each sign times its sender's scale / size:
            a mean of the q's, on 1/size of the elements
            c += server_error; the same rounding again: c -> server_scale * sign(c), server_error
            all-gather the server sign chunks and scales: every rank has the whole rounded mean

Per rank and call that moves numel/8 bytes of signs out (all-to-all), numel/8 back (all-gather of
the server signs) and 2 x size scales, against an fp32 all-reduce's 4 x numel. The two error
buffers carry what each rounding dropped into the next call ("error feedback"), so over steps the
rounded means add up to the true means.

``tensor`` is padded to the optimizer's ``worker_error`` length, a multiple of size x lcm(size, 8)
(adam.py): every chunk then holds whole bytes of signs.
"""

from __future__ import annotations

import math

import torch

from minitron import comm as dist
from minitron.trace import traced

# The bit a value packs to. "nccl" (the default) packs sign(x) + 1 != 0 through cupy's packbits,
# the same test the error uses; "compressed" (DeepSpeed's kernel for other accelerators) packs
# "sign bit clear", so -0.0 packs to 0 there while its error takes it as +1. Elsewhere they agree.
BACKENDS = ("nccl", "compressed")
_BIT_WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)   # first element: top bit


def _weights(like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=like.device)


def plus_minus_one(x: torch.Tensor) -> torch.Tensor:
    """+1 where x >= 0 (or -0.0), else -1: DeepSpeed's ``x.sign().add_(1).bool().float()*2-1``."""
    return x.sign().add_(1).bool().float().add_(-0.5).mul_(2.0)


def packbits(x: torch.Tensor, backend: str = "nccl") -> torch.Tensor:
    """One bit per element of ``x`` (numel a multiple of 8), eight to a byte, first element in the
    byte's top bit: numpy's packbits, which cupy's (and the XPU kernel's) order is."""
    bits = ~torch.signbit(x) if backend == "compressed" else x.sign().add(1).bool()
    return (bits.to(torch.uint8).reshape(-1, 8) * _weights(bits)).sum(1, dtype=torch.uint8)


def unpackbits(packed: torch.Tensor) -> torch.Tensor:
    """Bytes -> +1.0 (bit set) / -1.0 (clear), in packbits' order."""
    bits = (packed.to(torch.uint8).reshape(-1, 1) & _weights(packed)).ne(0)
    return bits.reshape(-1).float().add_(-0.5).mul_(2.0)


class CompressedBackend:
    """DeepSpeed's NcclBackend/CompressedBackend: the group is the data-parallel one."""

    def __init__(self, group=None, backend: str = "nccl"):
        self.world_group = group
        self.size = dist.get_world_size(group=group)
        self.rank = dist.get_rank(group=group)
        self.backend = backend

    @traced(args=lambda self, buffer_m, worker_error, server_error: {"numel": buffer_m.numel(),
                                                                    "padded": worker_error.numel()})
    def compressed_allreduce(self, buffer_m: torch.Tensor, worker_error: torch.Tensor,
                             server_error: torch.Tensor) -> torch.Tensor:
        """The mean over the group of every rank's ``buffer_m``, each element rounded to
        ±scale; ``worker_error`` and ``server_error`` are updated in place."""
        shape, numel = buffer_m.shape, buffer_m.numel()
        if numel == 0:   # nothing to send; DeepSpeed clears the errors and hands the tensor back
            worker_error.zero_()
            server_error.zero_()
            return buffer_m
        flat = buffer_m.reshape(-1)
        if numel != worker_error.numel():
            flat = torch.cat([flat, torch.zeros(worker_error.numel() - numel, device=flat.device)])
        else:
            flat = flat.clone()   # DeepSpeed's flatten of a 1-D tensor is the tensor: it adds in place
        # --- phase 1: every rank's signs, chunk r to rank r; every rank's scale to all ---
        flat.add_(worker_error)
        worker_scale = torch.linalg.norm(flat) / math.sqrt(flat.numel())
        worker_error.set_(flat - worker_scale * plus_minus_one(flat))
        signs = packbits(flat, self.backend).view(torch.int8).reshape(self.size, -1)
        recv_signs = torch.zeros_like(signs)
        dist.all_to_all_single(recv_signs, signs, group=self.world_group)
        recv_scales = [torch.zeros(1, dtype=worker_scale.dtype, device=flat.device) for _ in range(self.size)]
        dist.all_gather(recv_scales, worker_scale.reshape(1), group=self.world_group)
        # --- the server's chunk: the scaled signs' mean, rounded again with its own error ---
        server_m = unpackbits(recv_signs.view(torch.uint8)).reshape(self.size, -1) \
            .mul_(torch.stack(recv_scales).mul_(1 / self.size)).sum(0)
        server_m.add_(server_error)
        server_scale = torch.linalg.norm(server_m) / math.sqrt(server_m.numel())
        server_error.set_(server_m - server_scale * plus_minus_one(server_m))
        # --- phase 2: every rank's rounded chunk to every rank ---
        server_signs = packbits(server_m, self.backend).view(torch.int8)
        all_signs = [torch.zeros_like(server_signs) for _ in range(self.size)]
        dist.all_gather(all_signs, server_signs, group=self.world_group)
        all_scales = [torch.zeros(1, dtype=server_scale.dtype, device=flat.device) for _ in range(self.size)]
        dist.all_gather(all_scales, server_scale.reshape(1), group=self.world_group)
        out = unpackbits(torch.stack(all_signs).view(torch.uint8)).reshape(self.size, -1) \
            .mul_(torch.stack(all_scales)).flatten()
        return out[:numel].reshape(shape)
