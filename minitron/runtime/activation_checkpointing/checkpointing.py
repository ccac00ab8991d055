"""DeepSpeed's activation checkpoint: the activation half of ZeRO-R.

A checkpointed chunk of layers keeps only its inputs for the backward and recomputes the rest
(Megatron's ``tensor_parallel.checkpoint`` does as much). With tensor parallelism every rank of
the TP group keeps the *same* input, the hidden states all ranks share. ZeRO-R removes that
replication, as ZeRO-1..3 remove the optimizer's, gradients' and weights':

    partition_activations           each rank keeps 1/tp of every floating input: its contiguous
                                    slice of the flattened tensor (get_partition_start/size). The
                                    backward all-gathers the slices over the TP group, then recomputes.
    cpu_checkpointing               what is kept (whole, or the slice) lives in host memory; the
                                    backward copies it back to the device first.
    contiguous_memory_optimization  the slices are copied into buffers allocated at the first
                                    checkpoint of a forward, number_checkpoints of them per input
                                    position, so the kept slices do not fragment the allocator.
    synchronize_checkpoint_boundary the device is synchronized when each checkpoint's forward and
                                    backward start and end (so per-checkpoint timings mean something).
    profile                         rank 0 prints each checkpoint's forward and backward time.

Megatron-DeepSpeed routes Megatron's checkpointed layers here when --deepspeed-activation-
checkpointing is given (training/initialize.py: setup_deepspeed_random_and_activation_checkpointing).
The random streams are minitron's one tracker (core/tensor_parallel/random.py): Megatron-DeepSpeed
swaps Megatron's tracker for DeepSpeed's for the same reason, so that the dropouts inside the layers
and the checkpoint's replay of them draw from one set of streams.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from minitron import comm as dist   # as DeepSpeed's: from deepspeed import comm as dist
from minitron.accelerator import get_accelerator
from minitron.runtime.activation_checkpointing.config import parse_activation_checkpointing
from minitron.runtime.config import load_config
from minitron.core.tensor_parallel.random import _fork_rng, _get_all_rng_states, _set_all_rng_states, replace_checkpoint
from minitron.trace import traced
from minitron.trace.recorder import short_value


@dataclass
class _Settings:
    """What ``configure`` decided for this rank (DeepSpeed keeps the same as module globals)."""
    configured: bool = False
    partition: bool = False
    cpu: bool = False
    contiguous: bool = False
    synchronize: bool = False
    profile: bool = False
    num_checkpoints: int | None = None
    mp_rank: int = 0
    mp_size: int = 1
    mp_group: object = None
    # contiguous_memory_optimization: per input position, the forward's preallocated buffers and
    # how many of them are in use
    buffers: list = field(default_factory=list)
    used: list = field(default_factory=list)


_SETTINGS = _Settings()


def configure(mpu_, deepspeed_config=None, partition_activations=None, contiguous_checkpointing=None,
              num_checkpoints=None, checkpoint_in_cpu=None, synchronize=None, profile=None) -> None:
    """DeepSpeed's ``deepspeed.checkpointing.configure``: the ds_config's section first, then any
    argument that is not None over it. ``mpu_`` gives the tensor-parallel group the partitions
    are cut across (minitron's parallel_state is one)."""
    section = parse_activation_checkpointing(load_config(deepspeed_config)) if deepspeed_config is not None \
        else parse_activation_checkpointing({})
    given = {"partition_activations": partition_activations, "contiguous_memory_optimization": contiguous_checkpointing,
             "number_checkpoints": num_checkpoints, "cpu_checkpointing": checkpoint_in_cpu,
             "synchronize_checkpoint_boundary": synchronize, "profile": profile}
    section.update({key: value for key, value in given.items() if value is not None})
    s = _Settings(configured=True, partition=section["partition_activations"], cpu=section["cpu_checkpointing"],
                  contiguous=section["contiguous_memory_optimization"],
                  synchronize=section["synchronize_checkpoint_boundary"], profile=section["profile"],
                  num_checkpoints=section["number_checkpoints"])
    if s.contiguous and not s.partition:
        raise ValueError("contiguous_memory_optimization needs partition_activations (the buffers hold partitions)")
    if s.contiguous and s.num_checkpoints is None:
        raise ValueError("contiguous_memory_optimization needs number_checkpoints (how many buffers to allocate)")
    if mpu_ is not None:
        s.mp_rank, s.mp_size = mpu_.get_tensor_model_parallel_rank(), mpu_.get_tensor_model_parallel_world_size()
        s.mp_group = mpu_.get_tensor_model_parallel_group()
    global _SETTINGS
    _SETTINGS = s
    # Megatron-DeepSpeed's swap: from now on the transformer block checkpoints its chunks here
    replace_checkpoint(checkpoint)


def unconfigure() -> None:
    """Back to Megatron's checkpoint and no settings (minitron's, not DeepSpeed's: a later run or
    test in the same process must not inherit this one's partitioning)."""
    global _SETTINGS
    _SETTINGS = _Settings()
    replace_checkpoint(None)


def is_configured() -> bool:
    return _SETTINGS.configured


def reset() -> None:
    """Forget the contiguous buffers (DeepSpeed asks for this after forwards without a backward,
    e.g. evaluation, which would otherwise run past the preallocated list)."""
    _SETTINGS.buffers, _SETTINGS.used = [], []


# --- what is partitioned, and where each rank's slice starts -----------------------------------
def is_activation_to_checkpoint(item) -> bool:
    """A floating tensor with at least one element per rank: masks (bool) and position ids
    (int) are kept whole, as DeepSpeed keeps them."""
    return torch.is_tensor(item) and item.is_floating_point() and item.numel() >= _SETTINGS.mp_size


def get_partition_size(item) -> int:
    if item.numel() % _SETTINGS.mp_size:
        raise ValueError(f"a checkpointed activation of {item.numel()} elements does not split into "
                         f"{_SETTINGS.mp_size} equal partitions")
    return item.numel() // _SETTINGS.mp_size


def get_partition_start(item) -> int:
    return get_partition_size(item) * _SETTINGS.mp_rank


def _contiguous_slot(position: int, partition: torch.Tensor) -> torch.Tensor:
    """The next preallocated buffer for input ``position``; all of a forward's buffers for it are
    allocated at its first checkpoint, as DeepSpeed allocates them (a list of number_checkpoints
    tensors of one partition each: contiguous per checkpoint, not one block for all)."""
    s = _SETTINGS
    while len(s.buffers) <= position:
        s.buffers.append(None)
        s.used.append(0)
    if s.buffers[position] is None:
        device = torch.device("cpu") if s.cpu else partition.device
        s.buffers[position] = [torch.empty(partition.numel(), dtype=partition.dtype, device=device)
                               for _ in range(s.num_checkpoints)]
        s.used[position] = 0
    if s.used[position] == len(s.buffers[position]):
        raise RuntimeError(f"more checkpoints in one forward than number_checkpoints ({s.num_checkpoints}): "
                           "raise it in the ds_config's activation_checkpointing section")
    slot = s.buffers[position][s.used[position]].copy_(partition)
    s.used[position] += 1
    return slot


def _keep(item, position: int):
    """What the checkpoint holds for the backward in place of input ``item``."""
    s = _SETTINGS
    if not is_activation_to_checkpoint(item) or not (s.partition or s.cpu):
        return item
    if s.partition:
        start, size = get_partition_start(item), get_partition_size(item)
        part = item.detach().contiguous().view(-1).narrow(0, start, size).clone()
        if s.contiguous:
            return _contiguous_slot(position, part)
        return part.cpu() if s.cpu else part
    # cpu_checkpointing alone: the whole input, on the host (no copy when it is there already, a
    # CPU rank's case). DeepSpeed 0.19.8 overlaps this copy with compute on a side stream where
    # the device has one; the bytes kept are the same.
    return item.detach().to("cpu")


@traced(args=lambda kept, shapes, device: {
    "partitions": [short_value(k) for k in kept], "shapes": [list(s) for s in shapes], "device": str(device)})
def gather_partitioned_activations(kept: list, shapes: list, device) -> list:
    """Each kept slice back to the whole input: one all_gather_into_tensor over the TP group per
    input (trivially a reshape at tp 1)."""
    s, whole = _SETTINGS, []
    for part, shape in zip(kept, shapes):
        flat = torch.empty(part.numel() * s.mp_size, dtype=part.dtype, device=device)
        if s.mp_size == 1:
            flat.copy_(part)
        else:
            dist.all_gather_into_tensor(flat, part.to(device), group=s.mp_group)
        whole.append(flat.view(shape))
    return whole


def _restore(ctx, kept: list) -> list:
    """The inputs as the forward saw them, rebuilt from what was kept."""
    s, device = _SETTINGS, torch.device(get_accelerator().current_device_name())
    slots = [i for i, shape in enumerate(ctx.shapes) if shape is not None]
    if s.partition:
        gathered = gather_partitioned_activations([kept[i] for i in slots], [ctx.shapes[i] for i in slots], device)
        kept = list(kept)
        for i, tensor in zip(slots, gathered):
            kept[i] = tensor
    elif s.cpu:
        kept = [k.to(device) if i in slots else k for i, k in enumerate(kept)]
    inputs = []
    for item, wants_grad in zip(kept, ctx.wants_grad):
        if torch.is_tensor(item):
            item = item.detach()
            item.requires_grad_(wants_grad)
        inputs.append(item)
    return inputs


def _boundary(what: str, start: float | None = None) -> float:
    """synchronize_checkpoint_boundary and profile, at either end of a forward or backward."""
    s = _SETTINGS
    if s.synchronize:
        get_accelerator().synchronize()
    now = time.perf_counter()
    if s.profile and start is not None and (not dist.is_initialized() or dist.get_rank() == 0):
        print(f"activation checkpoint {what}: {1000 * (now - start):.2f} ms", flush=True)
    return now


class CheckpointFunction(torch.autograd.Function):
    """Forward under no_grad keeping only (a partition of) the inputs; backward restores them,
    replays the forward with the same random draws, and backpropagates through the replay."""

    @staticmethod
    def forward(ctx, run_function, *args):
        start = _boundary("forward")
        ctx.run_function = run_function
        ctx.rng_states = _get_all_rng_states()
        with torch.no_grad():
            outputs = run_function(*args)
        kept = [_keep(a, i) for i, a in enumerate(args)]
        ctx.shapes = [a.shape if k is not a else None for a, k in zip(args, kept)]
        ctx.wants_grad = [torch.is_tensor(a) and a.requires_grad for a in args]
        # save_for_backward takes tensors and None; anything else rides on ctx. The kept
        # tensors go through it so that saved-tensor hooks (core/saved_tensors.py) count them.
        ctx.tensor_slots = [i for i, k in enumerate(kept) if torch.is_tensor(k)]
        ctx.other_args = [None if torch.is_tensor(k) else k for k in kept]
        ctx.save_for_backward(*(kept[i] for i in ctx.tensor_slots))
        _boundary("forward", start)
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError("activation checkpointing works with .backward(), not torch.autograd.grad()")
        start = _boundary("backward")
        reset()   # the forward is over: the next one allocates its own buffers (DeepSpeed does the same)
        kept = list(ctx.other_args)
        for slot, tensor in zip(ctx.tensor_slots, ctx.saved_tensors):
            kept[slot] = tensor
        inputs = _restore(ctx, kept)
        with _fork_rng():
            _set_all_rng_states(*ctx.rng_states)   # the very draws of the first forward
            with torch.enable_grad():
                outputs = ctx.run_function(*inputs)
        if torch.is_tensor(outputs):
            outputs = (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if torch.is_tensor(o) and o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        _boundary("backward", start)
        return (None,) + tuple(x.grad if torch.is_tensor(x) else None for x in inputs)


def checkpoint(function, *args):
    """``deepspeed.checkpointing.checkpoint``: ``function(*args)`` with its activations dropped
    after forward and recomputed in backward, the inputs kept as configured. Unlike DeepSpeed,
    the caller's input tensors are left intact: DeepSpeed empties each partitioned input in place
    (``arg.data = torch.empty([])``) to free it at once, which also empties it for any later
    user; minitron's block drops its own reference as soon as the next chunk returns."""
    return CheckpointFunction.apply(function, *args)
