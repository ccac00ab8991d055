"""The backend decides the accelerator: gloo and fake ranks compute on the CPU even on a machine
with GPUs, nccl ranks on their GPU.

On a one-GPU machine the launcher's parent finds a GPU and chooses CUDA while it validates; a
forked gloo rank inherits that choice, and before this rule rank 1 asked for ``cuda:1`` ("invalid
device ordinal"). These tests need no GPU: the choice is a Python object, and a stand-in CUDA
accelerator that never touches a device shows which one a rank ends up with.
"""

from __future__ import annotations

import pytest

from minitron.accelerator import get_accelerator, real_accelerator, set_accelerator, set_accelerator_for_backend
from minitron.accelerator.cpu_accelerator import CPU_Accelerator
from minitron.accelerator.cuda_accelerator import CUDA_Accelerator
from minitron.launcher import LaunchConfig, run_on_ranks


class _SeenGPU(CUDA_Accelerator):
    """What a launcher on a GPU machine chose; any device call would be a bug in a gloo rank."""

    def set_device(self, device_index):
        raise AssertionError(f"a gloo rank asked for GPU {device_index}")


@pytest.fixture
def restore_accelerator(monkeypatch):
    monkeypatch.delenv("MINITRON_ACCELERATOR", raising=False)
    saved = real_accelerator._ACCELERATOR
    yield
    set_accelerator(saved)


@pytest.mark.parametrize("backend,kind", [("gloo", CPU_Accelerator), ("fake", CPU_Accelerator),
                                          ("nccl", CUDA_Accelerator)])
def test_the_backend_decides(backend, kind, restore_accelerator):
    set_accelerator(CPU_Accelerator() if kind is CUDA_Accelerator else _SeenGPU())
    set_accelerator_for_backend(backend)
    assert type(get_accelerator()) is kind


def test_the_users_own_choice_stands(restore_accelerator, monkeypatch):
    monkeypatch.setenv("MINITRON_ACCELERATOR", "cuda")
    chosen = _SeenGPU()
    set_accelerator(chosen)
    set_accelerator_for_backend("gloo")
    assert get_accelerator() is chosen


def test_gloo_ranks_forked_from_a_gpu_parent_compute_on_the_cpu(restore_accelerator):
    """The launcher's parent chose CUDA; each forked rank is a gloo rank on the CPU before any
    device is touched, and stays one through comm's init (as _initialize_distributed calls it)."""
    set_accelerator(_SeenGPU())

    def body(rank):
        from minitron import comm
        forked = type(get_accelerator()).__name__
        comm.init_distributed(dist_backend="gloo")
        return forked, type(get_accelerator()).__name__, get_accelerator().current_device_name()

    assert run_on_ranks(body, LaunchConfig(world_size=2)) == [("CPU_Accelerator", "CPU_Accelerator", "cpu")] * 2


@pytest.mark.parametrize("world,gpus,backend", [(16, 1, "gloo"), (1, 1, "nccl"), (2, 4, "nccl"), (2, 0, "gloo")])
def test_with_no_backend_given_nccl_needs_a_gpu_per_rank(world, gpus, backend, restore_accelerator, monkeypatch,
                                                          capsys):
    """The README's 16-rank trace on a one-GPU laptop runs gloo ranks, and says why."""
    import torch

    from minitron.cli import common
    from minitron.training import arguments

    monkeypatch.setattr(arguments, "gpus_possible", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    set_accelerator(_SeenGPU())
    assert common.default_backend(world) == backend
    said = capsys.readouterr().out
    assert ("so gloo (CPU ranks)" in " ".join(said.split())) == (backend == "gloo" and gpus > 0)
