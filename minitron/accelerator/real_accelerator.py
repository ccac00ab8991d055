"""get_accelerator(): pick CUDA+NCCL or CPU+gloo once per process.

DeepSpeed reads DS_ACCELERATOR, else probes for the installed device libraries. We read
MINITRON_ACCELERATOR ('cuda' or 'cpu'), else use CUDA when torch sees a GPU. The choice decides
the default distributed backend: the accelerator knows which collective library matches its
memory (NCCL moves GPU tensors; gloo moves CPU tensors).
"""

from __future__ import annotations

import os

import torch

from minitron.accelerator.cpu_accelerator import CPU_Accelerator
from minitron.accelerator.cuda_accelerator import CUDA_Accelerator

_ACCELERATOR = None


def get_accelerator():
    global _ACCELERATOR
    if _ACCELERATOR is None:
        name = os.environ.get("MINITRON_ACCELERATOR")
        if name is None:
            # device_count() asks the driver without creating a CUDA context, so it is safe
            # in a parent that forks ranks later.
            name = "cuda" if torch.cuda.device_count() > 0 else "cpu"
        if name == "cuda":
            _ACCELERATOR = CUDA_Accelerator()
        elif name == "cpu":
            _ACCELERATOR = CPU_Accelerator()
        else:
            raise ValueError(f"MINITRON_ACCELERATOR={name!r}: use 'cuda' or 'cpu'")
    return _ACCELERATOR


def set_accelerator(accelerator) -> None:
    global _ACCELERATOR
    _ACCELERATOR = accelerator
