"""The random states a checkpoint carries, and what a resume on another kind of device does with them.

Each rank saves what Megatron's ``get_rng_state`` saves, under Megatron's keys, plus the kind of
device they came from::

    random_rng_state     python's ``random``           host generators: the same algorithm on every
    np_rng_state         numpy's global generator      machine, so they are restored wherever the
    torch_rng_state      torch's CPU generator         run resumes
    cuda_rng_state       torch's CUDA generator        device generators: a CPU generator's state is
    rng_tracker_states   the tracker's named streams   mt19937's 5056 bytes, a CUDA one's Philox's seed
                         (dropout inside tp regions)   and offset, 16 bytes
    device               "cpu" or "cuda"               which kind of device the device states describe

The device states cannot be converted: no mt19937 state continues a Philox stream. A resume on the
other kind of device therefore reseeds them, deterministically, the way a fresh run seeds them
(``_set_random_seed``: the seed plus 100 per pipeline stage, then the tracker's offsets), from the
checkpoint's seed plus its iteration, so the resumed run does not replay the dropout masks of its
first iterations; it prints one line saying so. With dropout off no draw is made from these
streams, and the resumed losses are those of a run that never stopped.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from minitron.accelerator import get_accelerator
from minitron.core.tensor_parallel import get_cuda_rng_tracker, model_parallel_cuda_manual_seed
from minitron.training.initialize import rank_seed
from minitron.training.utils import print_rank_0


def device_kind() -> str:
    """'cuda' or 'cpu': the kind of device this rank computes on, and so whose generators its
    dropout draws from."""
    return torch.device(get_accelerator().current_device_name()).type


def get_rng_state() -> dict:
    """This rank's random states (Megatron's get_rng_state, tagged with the device kind). Every
    tensor here is a host copy: torch hands generator states out as CPU byte tensors, CUDA's too."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    kind = device_kind()
    return {"random_rng_state": random.getstate(),
            "np_rng_state": [name, keys.tolist(), pos, has_gauss, gauss],   # plain data: a weights-only load
            "torch_rng_state": torch.get_rng_state(),
            "cuda_rng_state": torch.cuda.get_rng_state() if kind == "cuda" else None,
            "rng_tracker_states": get_cuda_rng_tracker().get_states(),
            "device": kind}


def _in_megatron_keys(state: dict) -> dict:
    """A state minitron saved before it used Megatron's keys (and saved on the CPU only)."""
    if "device" in state:
        return state
    return {"random_rng_state": state["random"], "np_rng_state": state["numpy"], "torch_rng_state": state["torch"],
            "cuda_rng_state": None, "rng_tracker_states": state["tracker"], "device": "cpu"}


def set_rng_state(state: dict, seed: int, iteration: int, data_parallel_random_init: bool = False) -> None:
    """Restore ``state`` (get_rng_state's); device states saved on another kind of device are
    reseeded from ``seed`` and ``iteration`` (the checkpoint's) instead. The host states are
    restored last: reseeding the tracker reseeds torch's CPU generator too."""
    state = _in_megatron_keys(state)
    here = device_kind()
    if state["device"] == here:
        if here == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng_state"])
        get_cuda_rng_tracker().set_states(state["rng_tracker_states"])
    else:
        _reseed_device_streams(seed + iteration, data_parallel_random_init)
        print_rank_0(f"> the checkpoint's device random states come from {state['device']} and this run computes "
                     f"on {here}; they do not convert, so the device generator and the tracker's streams start "
                     f"from seed {seed} + iteration {iteration}, as a fresh run seeds them (python, numpy and "
                     f"torch's CPU generator are restored)")
    random.setstate(state["random_rng_state"])
    name, keys, pos, has_gauss, gauss = state["np_rng_state"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch_rng_state"])


def _reseed_device_streams(seed: int, data_parallel_random_init: bool) -> None:
    """Seed the device's generator and the tracker's streams as a fresh run's _set_random_seed
    seeds them from ``seed``."""
    model_parallel_cuda_manual_seed(rank_seed(seed, data_parallel_random_init))   # the default device stream and the tracker's streams
