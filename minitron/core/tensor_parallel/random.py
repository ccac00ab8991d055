"""Random streams for a tensor-parallel model: when dropout must agree across ranks, and when not.

Two kinds of activations meet a dropout inside a TP model:

* replicated ones (the hidden states between layers, without sequence parallelism): every
  rank of the TP group holds the same tensor, and must drop the *same* elements, or the
  replicas drift apart;
* sharded ones (each rank's attention heads; with sequence parallelism, each rank's part of
  the sequence): the ranks hold different pieces of one big tensor, and must drop
  *independent* elements, or the pieces would share one mask pattern.

So each rank keeps two generator states and switches between them (Megatron's scheme):

    default stream           seed                  same on every rank of a TP group
    'model-parallel-rng'     seed + 2718 + tp_rank different on each rank of a TP group

``get_cuda_rng_tracker().fork()`` runs a block on the model-parallel stream and then puts the
default stream back exactly where it was. Megatron swaps CUDA generator states; minitron swaps
the CPU generator's too, since that is where a CPU rank's dropout draws from.
"""

from __future__ import annotations

import contextlib

import torch

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state

_MODEL_PARALLEL_RNG_TRACKER_NAME = "model-parallel-rng"
_DATA_PARALLEL_RNG_TRACKER_NAME = "data-parallel-rng"
_EXPERT_PARALLEL_RNG_TRACKER_NAME = "expert-parallel-rng"


# --- the generators a dropout may draw from ----------------------------------------------
# A CPU tensor's dropout draws from torch's CPU generator, a GPU tensor's from the CUDA one.
# A stream's state is therefore the pair (CPU state, CUDA state or None): forking swaps both,
# so the scheme holds wherever the activations live (CPU ranks, GPU ranks, CPU tests on a
# machine that happens to have a GPU).
def _on_cuda() -> bool:
    return get_accelerator().device_count() > 0


def _get_device_rng_state() -> tuple:
    return torch.get_rng_state(), (torch.cuda.get_rng_state() if _on_cuda() else None)


def _set_device_rng_state(state: tuple) -> None:
    cpu_state, cuda_state = state
    torch.set_rng_state(cpu_state)
    if cuda_state is not None:
        torch.cuda.set_rng_state(cuda_state)


def _device_manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(seed)
    if _on_cuda():
        torch.cuda.manual_seed(seed)


class CudaRNGStatesTracker:
    """Named generator states; ``fork(name)`` borrows one for a block and saves its progress.

    (The name is Megatron's; each state here is the pair of CPU and CUDA generator states.)
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.states_: dict[str, tuple] = {}
        self.seeds_: set[int] = set()
        self._current: str | None = None  # the stream a fork() is running on, if any

    def is_initialized(self) -> bool:
        return bool(self.states_)

    def get_states(self) -> dict[str, tuple]:
        return dict(self.states_)

    def set_states(self, states: dict[str, tuple]) -> None:
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        """Create stream ``name`` seeded with ``seed``, leaving the current stream untouched."""
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} is already used by another RNG stream")
        if name in self.states_:
            raise ValueError(f"RNG stream {name!r} already exists")
        self.seeds_.add(seed)
        original = _get_device_rng_state()
        _device_manual_seed(seed)
        self.states_[name] = _get_device_rng_state()
        _set_device_rng_state(original)

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_RNG_TRACKER_NAME):
        """Run the block on stream ``name``; afterwards the default stream resumes untouched."""
        if name not in self.states_:
            raise ValueError(f"RNG stream {name!r} was never added: call model_parallel_cuda_manual_seed")
        if self._current == name:
            # Already on this stream (e.g. a dropout inside the block that sequence
            # parallelism forks as a whole): forking again would replay old numbers.
            yield
            return
        original, outer = _get_device_rng_state(), self._current
        _set_device_rng_state(self.states_[name])
        self._current = name
        try:
            yield
        finally:
            self.states_[name] = _get_device_rng_state()  # remember how far this stream got
            _set_device_rng_state(original)
            self._current = outer


_CUDA_RNG_STATE_TRACKER = CudaRNGStatesTracker()


def get_cuda_rng_tracker() -> CudaRNGStatesTracker:
    return _CUDA_RNG_STATE_TRACKER


def get_expert_parallel_rng_tracker_name() -> str:
    return _EXPERT_PARALLEL_RNG_TRACKER_NAME


def get_data_parallel_rng_tracker_name() -> str:
    return _DATA_PARALLEL_RNG_TRACKER_NAME


def model_parallel_cuda_manual_seed(seed: int, tp_rank: int | None = None,
                                    ep_rank: int | None = None, etp_rank: int | None = None) -> None:
    """Seed the default stream and the tracked ones. Call after initialize_model_parallel.

    default and 'data-parallel-rng': ``seed``, equal across a TP group (replicated work);
    'model-parallel-rng': ``seed + 2718 + tp_rank``, distinct per TP rank (sharded work), yet
    equal across data-parallel replicas, which hold the same shards;
    'expert-parallel-rng': ``seed + 1024 + 100 * ep_rank + etp_rank``, for MoE experts.
    (2718 is arbitrary; any positive offset keeps the streams apart.)
    """
    if tp_rank is None:
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
    if ep_rank is None:
        ep_rank = parallel_state.get_expert_model_parallel_rank()
    if etp_rank is None:
        etp_rank = torch.distributed.get_rank(group=parallel_state.get_expert_tensor_parallel_group())
    tracker = get_cuda_rng_tracker()
    tracker.reset()
    _device_manual_seed(seed)
    tracker.add(_DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(_MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(_EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024 + 100 * ep_rank + etp_rank)


# --- activation recomputation ------------------------------------------------------------
# Recomputing a piece of the forward in backward gives the same activations only if every
# dropout inside it draws the same mask as the first time. So the checkpoint photographs every
# generator a dropout could draw from (the CPU one, the CUDA one, and each tracked stream,
# with which of them is current) before the first forward, sets them back before the second,
# and afterwards restores whatever the generators had reached in between: recomputation must
# not change the random numbers of anything that runs after it.
def _get_all_rng_states() -> tuple:
    tracker = get_cuda_rng_tracker()
    return _get_device_rng_state(), tracker.get_states(), tracker._current


def _set_all_rng_states(device_state: tuple, tracker_states: dict, current: str | None) -> None:
    _set_device_rng_state(device_state)
    tracker = get_cuda_rng_tracker()
    tracker.set_states(tracker_states)
    tracker._current = current


@contextlib.contextmanager
def _fork_rng():
    """Run a block, then put every generator back where it was before it."""
    states = _get_all_rng_states()
    try:
        yield
    finally:
        _set_all_rng_states(*states)


def _detach_variable(inputs: tuple) -> tuple:
    """Fresh leaves with the same values, so the recomputed graph starts at them."""
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            leaf = x.detach()
            leaf.requires_grad_(x.requires_grad)
            out.append(leaf)
        else:
            out.append(x)
    return tuple(out)


class CheckpointFunction(torch.autograd.Function):
    """Forward without keeping activations; backward runs the forward again, then its backward.

    The forward runs under no_grad, so the only tensors kept are the inputs (``ctx.save_for_
    backward``). In backward the inputs become fresh leaves, the generators are set back to
    their state before the forward, ``run_function`` runs again with autograd on, and the
    gradients of the outputs flow through that second graph to the leaves, whose .grad is
    what this Function returns for its inputs. Parameters used inside get their gradients from
    the inner backward as usual.
    """

    @staticmethod
    def forward(ctx, run_function, distribute_saved_activations, *args):
        if distribute_saved_activations:
            # Megatron can keep 1/tp of the input per rank and all-gather it back in backward;
            # minitron keeps the whole input (the flag exists for the call's shape only).
            raise NotImplementedError("distribute_saved_activations is not available in minitron")
        ctx.run_function = run_function
        ctx.rng_states = _get_all_rng_states()
        with torch.no_grad():
            outputs = run_function(*args)
        # save_for_backward takes tensors and None; anything else rides on ctx.
        ctx.tensor_slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.other_args = [None if isinstance(a, torch.Tensor) else a for a in args]
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_slots))
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError("recomputation works with .backward(), not torch.autograd.grad()")
        args = list(ctx.other_args)
        for slot, tensor in zip(ctx.tensor_slots, ctx.saved_tensors):
            args[slot] = tensor
        with _fork_rng():
            _set_all_rng_states(*ctx.rng_states)   # the very draws of the first forward
            inputs = _detach_variable(tuple(args))
            with torch.enable_grad():
                outputs = ctx.run_function(*inputs)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs)
                 if isinstance(o, torch.Tensor) and o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        grads = tuple(x.grad if isinstance(x, torch.Tensor) else None for x in inputs)
        return (None, None) + grads


def checkpoint(function, distribute_saved_activations: bool, *args):
    """``function(*args)``, its activations dropped after forward and recomputed in backward.

    Megatron's ``tensor_parallel.checkpoint``: torch.utils.checkpoint's re-entrant variant,
    made aware of the model-parallel RNG streams (above). At least one of ``args`` must
    require grad, or autograd never calls the backward that recomputes.
    """
    return CheckpointFunction.apply(function, distribute_saved_activations, *args)


# Megatron-DeepSpeed swaps this checkpoint for deepspeed.checkpointing.checkpoint when it is given
# --deepspeed-activation-checkpointing (ZeRO-R). The model sits on a floor below DeepSpeed's
# runtime and never imports it: DeepSpeed's configure() installs its checkpoint here
# (runtime/activation_checkpointing/checkpointing.py), and the transformer block asks for it.
_REPLACEMENT = None


def replace_checkpoint(function) -> None:
    """Checkpoint the transformer block's chunks with ``function(chunk, *args)`` instead (None:
    Megatron's own again)."""
    global _REPLACEMENT
    _REPLACEMENT = function


def checkpoint_replacement():
    """The installed replacement, or None."""
    return _REPLACEMENT
