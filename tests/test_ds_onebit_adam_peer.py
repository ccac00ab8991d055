"""1-bit Adam held against DeepSpeed's own OnebitAdam, in the same forked gloo ranks: the same model,
config and batches give the same losses and weights through the initialisation call, the warm-up,
the freeze and the compressed steps.

DeepSpeed 0.19.8 (the peer venv's) has no 1-bit Adam: 0.19.7 removed it. The yardstick is 0.19.6,
the last release with it, put beside the peer venv (NEEDS_0196 says how) and imported in the
ranks ahead of 0.19.8.

None of its four exchange backends runs on a CPU as shipped: "nccl" and "mpi" pack bits with cupy
(CUDA), "hccl" with torch_npu, and "compressed" loads a PackbitsBuilder kernel that DeepSpeed's CPU
accelerator does not build (its NotImplementedBuilder). So the ranks run "compressed" with that one
kernel stood in for by numpy (``NumpyPacker``: what csrc/xpu/packbits/packing.cpp states: a set bit
for each float whose sign bit is clear, the first float in the byte's top bit; unpacked, 1 -> +1.0
and 0 -> -1.0). One more line of DeepSpeed's cannot run on gloo: it all-gathers each 0-dim scale
into 1-element buffers, which NCCL takes (it compares element counts) and gloo refuses ("invalid
tensor size"); ``gloo_all_gather`` hands gloo the scale as the 1-element tensor NCCL would move.
Everything else is DeepSpeed's: the engine turning its all-reduce off at the freeze,
OnebitAdam's three stages, and compressed_allreduce's arithmetic and collectives.

fp32 only. In fp16 DeepSpeed 0.19.6 on its CPU accelerator hands OnebitAdam gradients divided by
the loss scale twice (the fp16 gradients are already the unscaled mean when FP16_Optimizer divides
by its 65536 again: exp_avg came out 0.1 x g / 65536 after one step), so eps outweighs sqrt(v)
and the steps shrink; minitron follows the rest of that path (one flat tensor per group, the
optimizer's first call made on zero gradients as FP16_Optimizer is built), not that division.
"""
import os

import numpy as np
import pytest
import torch

from deepspeed_child import NEEDS_DEEPSPEED
from distributed import run_ranks
from test_ds_checkpoint import TiedNet, train

DS_0196 = os.environ.get("DEEPSPEED_0196", "/tmp/vds0196")
NEEDS_0196 = pytest.mark.skipif(
    not os.path.exists(os.path.join(DS_0196, "deepspeed", "runtime", "fp16", "onebit", "adam.py")),
    reason=f"needs DeepSpeed 0.19.6 (the last with 1-bit Adam) at {DS_0196}: DS_BUILD_OPS=0 pip install --no-deps "
           f"--no-build-isolation --target {DS_0196} deepspeed==0.19.6 (or set DEEPSPEED_0196 to where it is)")
pytestmark = [*NEEDS_DEEPSPEED, NEEDS_0196]
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it

STEPS = 6
CONFIG = {"train_batch_size": 4, "gradient_clipping": 0.0,
          "optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "weight_decay": 0.01, "freeze_step": 3,
                                                         "comm_backend_name": "compressed"}}}


class NumpyPacker:
    """The packbits/unpackbits pair DeepSpeed's CompressedBackend loads, in numpy."""

    def packbits(self, tensor, numel, rank):
        return torch.from_numpy(np.packbits(~np.signbit(tensor.numpy().reshape(-1)[:numel])))

    def unpackbits(self, tensor, numel, rank):
        return torch.from_numpy(np.unpackbits(tensor.numpy()).astype(np.float32) * 2 - 1)


def gloo_all_gather(all_gather):
    def wrapper(tensor_list, tensor, *args, **kwargs):
        return all_gather(tensor_list, tensor.reshape(1) if tensor.dim() == 0 else tensor, *args, **kwargs)
    return wrapper


class NumpyPackbitsBuilder:
    def load(self):
        return NumpyPacker()


def _both(rank):
    import sys
    sys.path.insert(0, DS_0196)   # 0.19.6 ahead of the venv's 0.19.8
    import deepspeed
    import deepspeed.runtime.comm.compressed as compressed
    assert deepspeed.__version__ == "0.19.6"
    compressed.PackbitsBuilder = NumpyPackbitsBuilder
    torch.distributed.all_gather = gloo_all_gather(torch.distributed.all_gather)
    from minitron.runtime import initialize
    out = {}
    for who, init in (("minitron", initialize), ("deepspeed", deepspeed.initialize)):
        engine, *_ = init(model=TiedNet(), config=CONFIG)
        out[who] = {"losses": train(engine, rank, "fp32", range(STEPS)),
                    "weights": [p.detach().clone() for p in engine.module.parameters()],
                    "allreduce": engine.enable_backward_allreduce}
    return out


@pytest.fixture(scope="module")
def both():
    return run_ranks(_both, world_size=2, tp=None)


def test_same_losses_and_weights_as_deepspeed_0196(both):
    for rank in both:
        mine, ds = rank["minitron"], rank["deepspeed"]
        assert not mine["allreduce"] and not ds["allreduce"]   # both froze at step 3
        # the same arithmetic in the same order, fp32 throughout: bit for bit
        assert mine["losses"] == ds["losses"]
        assert all(torch.equal(a, b) for a, b in zip(mine["weights"], ds["weights"]))
