"""What one rank's checkpoint holds of its random states (chapter 18, "Between devices").

    python scripts/show_rng_state.py

Seeds the generators as a CPU rank at tensor-parallel rank 0 does (seed 7), then prints each
entry of get_rng_state() with its size: the states a resume on another kind of device keeps, and
the ones it must reseed.
"""

from __future__ import annotations

import torch

from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
from minitron.training.checkpointing_rng import get_rng_state


def describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.numel()} bytes"
    if isinstance(value, tuple):   # a tracker stream: (CPU state, CUDA state or None)
        return "(" + ", ".join(describe(v) for v in value) + ")"
    return repr(value)


def main() -> None:
    model_parallel_cuda_manual_seed(7, tp_rank=0, ep_rank=0, etp_rank=0)
    state = get_rng_state()
    version, words, _ = state["random_rng_state"]
    print(f"{'random_rng_state':20} python's Mersenne Twister: version {version}, {len(words)} words")
    name, keys, *_ = state["np_rng_state"]
    print(f"{'np_rng_state':20} numpy's {name}: {len(keys)} words")
    for key in ("torch_rng_state", "cuda_rng_state", "device"):
        print(f"{key:20} {describe(state[key])}")
    streams = state["rng_tracker_states"]
    print(f"{'rng_tracker_states':20} {len(streams)} streams, each (CPU state, CUDA state):")
    for name, stream in streams.items():
        print(f"  {name:19} {describe(stream)}")


if __name__ == "__main__":
    main()
