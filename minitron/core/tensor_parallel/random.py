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
    from minitron.accelerator import get_accelerator
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
