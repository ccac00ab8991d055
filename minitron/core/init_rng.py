"""Layout-independent initialization: each layer draws its weights from a seed of its own.

Megatron seeds each pipeline stage with ``seed + 100 * pp_rank`` and lets its layers draw
from that stream in order, so the same model split 2 ways or 4 ways starts from different
weights (equally good ones). minitron promises more: every parallel layout computes the
serial model's numbers. So a layer's initial weights depend only on the run's seed and the
layer's global number (0 for the embedding, 1..L for the transformer layers, L+1 for an untied
output layer); tensor-parallel layers draw the full weight and keep their slice, so tp does
not change them either.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from minitron.accelerator import get_accelerator


@contextmanager
def layer_init_rng(config, index: int):
    """Within the block, torch's CPU generator and this rank's device generator are seeded for
    layer ``index``; after it, both are back where they were (dropout and data keep their own
    streams). A weight drawn whole on the CPU (every CPU rank; a GPU rank with
    --use-cpu-initialization) draws the layer's numbers from the CPU generator. A GPU rank
    without that flag draws each tensor-parallel slice under the tracker's model-parallel fork,
    which this seed does not touch (those weights depend on tp, as in Megatron); what it draws
    on the device outside the tracker comes from the device generator seeded here. Only the
    current device: ``torch.manual_seed`` would reseed every GPU of the machine, and
    ``fork_rng`` would have to save and restore them all."""
    global _index
    outer, _index = _index, index   # init_device asks which layer is being built (meta builds)
    try:
        with _seeded(config, index):
            yield
    finally:
        _index = outer


# --init-model-with-meta-device (Megatron-FSDP): the model is built as shapes only, then each
# FSDP unit is built again for real, alone (fsdp/meta_init.py). Since a layer's numbers depend
# only on the seed and its index, building layer n alone draws what the whole model's build
# draws for it. ``_keep`` says, of the index being built (None: outside every layer), whether
# its tensors are real; None: a normal build, everything real.
_index = None
_keep = None


@contextmanager
def build_on_meta(keep=lambda index: False):
    """Within the block, tensors made through init_device are meta except those of the layers
    ``keep`` admits (keep(index), index None outside layer_init_rng)."""
    global _keep
    outer, _keep = _keep, keep
    try:
        yield
    finally:
        _keep = outer


def building_on_meta() -> bool:
    """Is the tensor being made now to be a shape only (build_on_meta)?"""
    return _keep is not None and not _keep(_index)


@contextmanager
def _seeded(config, index: int):
    seed = getattr(config, "init_seed", None)
    if seed is None:  # a config built by hand: plain torch behaviour
        yield
        return
    device = torch.device(get_accelerator().current_device_name())
    gpus = [device.index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=gpus):
        torch.default_generator.manual_seed(seed * 10_007 + index)
        if gpus:
            torch.cuda.manual_seed(seed * 10_007 + index)   # the current device's generator only
        yield
