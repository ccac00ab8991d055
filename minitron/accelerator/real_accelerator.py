"""get_accelerator(): pick CUDA+NCCL or CPU+gloo once per process.

DeepSpeed reads DS_ACCELERATOR, else probes for the installed device libraries. We read
MINITRON_ACCELERATOR ('cuda' or 'cpu'), else use CUDA when torch sees a GPU. The choice decides
the default distributed backend: the accelerator knows which collective library matches its
memory (NCCL moves GPU tensors; gloo moves CPU tensors).

Once a rank's backend is known the arrow turns round: the backend decides the accelerator
(set_accelerator_for_backend). A gloo or fake rank computes on the CPU even on a machine with
GPUs: sixteen gloo ranks on a one-GPU machine would otherwise each ask for ``cuda:<local
rank>``, and fifteen of those devices do not exist.
"""

from __future__ import annotations

import os

import torch

from minitron.accelerator.cpu_accelerator import CPU_Accelerator
from minitron.accelerator.cuda_accelerator import CUDA_Accelerator
from minitron.trace import recorder, traced

_ACCELERATOR = None
_RECORDED_BY = None  # the trace recorder that has already recorded this process's accelerator
_FORKED = False      # this process is a forked child: CUDA is not for it (see _after_fork_in_child)


def get_accelerator():
    """This process's accelerator, chosen on the first call."""
    if _ACCELERATOR is None or _RECORDED_BY is not recorder.active():
        return _choose_accelerator()
    return _ACCELERATOR


def _accelerator_name() -> str:
    if _ACCELERATOR is not None:
        return _ACCELERATOR.device_name()
    name = os.environ.get("MINITRON_ACCELERATOR")
    if name is None:
        # device_count() asks the driver without creating a CUDA context, so it is safe
        # in a parent that forks ranks later.
        name = "cuda" if not _FORKED and torch.cuda.device_count() > 0 else "cpu"
    return name


# Traced under DeepSpeed's name, once per traced process: the trace says which accelerator, and
# whether this call chose it or found it chosen (a forked rank inherits the choice its launcher
# made while validating the arguments). The later calls, thousands of them (every fork of the
# dropout RNG asks), take the plain path above and stay out of the trace.
@traced(name="minitron.accelerator.real_accelerator.get_accelerator",
        args=lambda: {"accelerator": _accelerator_name(), "chosen_now": _ACCELERATOR is None})
def _choose_accelerator():
    global _ACCELERATOR, _RECORDED_BY
    if _ACCELERATOR is None:
        name = _accelerator_name()
        if name == "cuda":
            _ACCELERATOR = CUDA_Accelerator()
        elif name == "cpu":
            _ACCELERATOR = CPU_Accelerator()
        else:
            raise ValueError(f"MINITRON_ACCELERATOR={name!r}: use 'cuda' or 'cpu'")
        _wait_on_device_while_tracing(_ACCELERATOR)
    _RECORDED_BY = recorder.active()
    return _ACCELERATOR


def set_accelerator(accelerator) -> None:
    global _ACCELERATOR
    _ACCELERATOR = accelerator
    _wait_on_device_while_tracing(accelerator)


def _wait_on_device_while_tracing(accelerator) -> None:
    """On a GPU the host returns from a kernel launch before the kernel has run: a traced span
    measures GPU time only if the recorder waits for the device at its start and end. On the
    CPU there is nothing to wait for (None also drops a hook a forked child inherited)."""
    recorder.set_device_sync(accelerator.synchronize if isinstance(accelerator, CUDA_Accelerator) else None)


def _after_fork_in_child() -> None:
    """CUDA does not survive a fork, and minitron forks only CPU processes (gloo ranks, the
    players of fake ranks): a forked child computes on the CPU whatever its parent chose while
    validating on a GPU machine, and one that chooses later chooses the CPU."""
    global _FORKED
    _FORKED = True
    if isinstance(_ACCELERATOR, CUDA_Accelerator) and "MINITRON_ACCELERATOR" not in os.environ:
        set_accelerator(CPU_Accelerator())


os.register_at_fork(after_in_child=_after_fork_in_child)


def set_accelerator_for_backend(backend: str) -> None:
    """Make this process's accelerator the one ``backend`` moves tensors for: the CPU for gloo
    (host memory) and fake (no data moves at all), CUDA for nccl. MINITRON_ACCELERATOR, where
    set, was the user's own choice and stands."""
    if "MINITRON_ACCELERATOR" in os.environ or backend not in ("gloo", "nccl", "fake"):
        return   # a mixed backend ("cpu:gloo,cuda:nccl") names both devices: the choice stands
    wanted = CUDA_Accelerator if backend == "nccl" else CPU_Accelerator
    if not isinstance(_ACCELERATOR, wanted):
        set_accelerator(wanted())
