"""DeepSpeed's "Muon" held against the real DeepSpeed 0.19.8 on its CPU accelerator, in the same
forked gloo ranks: its Newton-Schulz functions on the same matrices, and a 2-rank stage-0 engine
run (TiedNet, one config) whose losses and weights must equal DeepSpeed's.

DeepSpeed wraps muon_update and both iterations in torch.compile; here they run eager (dynamo
disabled in the ranks). Compiled, inductor fuses each half-precision expression and keeps its
intermediates in fp32, rounding once where eager torch rounds every op: the standard (bf16)
iteration then differs by up to 0.02 an element from eager, and the losses by 1.4e-4 relative
after three steps. That is a property of the compiler, not of Muon, so the peer holds the
arithmetic eager against eager. Its CPU FusedAdam (the Adam half) is JIT-built on first use.
"""
import itertools
import os

import pytest
import torch

from distributed import run_ranks
from deepspeed_child import NEEDS_DEEPSPEED
from test_ds_checkpoint import TiedNet, train

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it

SHAPES = [(16, 48), (48, 16), (32, 32)]
MUON = {"lr": 0.02, "adam_lr": 0.01, "weight_decay": 0.1}
CASES = {   # the Adam half: DeepSpeed's CPU FusedAdam (its default), or torch's AdamW (torch_adam)
    "fused": {"train_batch_size": 4, "gradient_clipping": 1.0, "zero_optimization": {"stage": 0},
              "optimizer": {"type": "Muon", "params": MUON}},
    "torch_adam": {"train_batch_size": 4, "gradient_clipping": 1.0, "zero_optimization": {"stage": 0},
                   "optimizer": {"type": "Muon", "params": {**MUON, "torch_adam": True}}},
}


def _both(rank):
    import deepspeed   # only in the ranks: the tests' parent process stays free of it
    torch._dynamo.config.disable = True   # DeepSpeed's torch.compile wrappers run eager (docstring)
    from deepspeed.runtime.zero.muon import original_muon as theirs
    from minitron.runtime import initialize
    from minitron.runtime.zero.muon import original_muon as ours
    out = {}
    torch.manual_seed(0)
    matrices = [torch.randn(shape) for shape in SHAPES]
    for method in ("zeropower_via_gram_newtonschulz", "zeropower_via_newtonschulz5"):
        out[method] = [(getattr(ours, method)(G).float(), getattr(theirs, method)(G, 5).float()) for G in matrices]
    for (case, config), (who, init) in itertools.product(CASES.items(), (("minitron", initialize),
                                                                          ("deepspeed", deepspeed.initialize))):
        engine, *_ = init(model=TiedNet(), config=config)
        out[case, who] = {"losses": train(engine, rank, "fp32", range(3)),
                    "weights": [p.detach().clone() for p in engine.module.parameters()],
                    "basic": type(engine.basic_optimizer).__name__,
                    "aux": type(engine.basic_optimizer.aux_optimizer).__name__,
                    "tags": [p.use_muon for p in engine.module.parameters()]}
    return out


@pytest.fixture(scope="module")
def both():
    return run_ranks(_both, world_size=2, tp=None)


@pytest.mark.parametrize("method", ["zeropower_via_gram_newtonschulz", "zeropower_via_newtonschulz5"])
def test_same_newton_schulz_as_deepspeed(both, method):
    # Same arithmetic in the same dtype (fp16 for gram where mkldnn has it, bf16 for standard),
    # eager both: the same ops in the same order round the same way
    for ours, theirs in both[0][method]:
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_same_losses_and_weights_as_deepspeed_torch_adam(both):
    """With torch's AdamW for the Adam half, both runs take the same torch ops: the losses are
    equal bit for bit over three steps. The weights may sit an fp32 ulp or two apart: minitron's
    clipping norm sums one flat gradient, DeepSpeed's per tensor, and AdamW steps one flat master
    where DeepSpeed steps each tensor (another summation order, another vector kernel); rel 1e-6."""
    for rank in (0, 1):
        mine, ds = both[rank]["torch_adam", "minitron"], both[rank]["torch_adam", "deepspeed"]
        assert (mine["basic"], mine["aux"]) == (ds["basic"], ds["aux"]) == ("MuonWithAuxAdam", "AdamW")
        assert mine["tags"] == ds["tags"]
        assert mine["losses"] == ds["losses"]
        for a, b in zip(mine["weights"], ds["weights"]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_same_losses_as_deepspeed_fused_adam(both):
    """With DeepSpeed's FusedAdam (its C++ kernel: FMAs, SIMD) the Adam half leaves the vectors a
    few fp32 ulps from minitron's after step 1 (rel 1e-6, as tests/test_ds_optimizer_types_peer.py
    holds), and step 2's gradients carry that into Newton-Schulz, which rounds its input to fp16
    (ulp 2^-11 relative) and amplifies the smallest singular directions (slope ~a^5 = 485 at 0):
    measured, enc.weight (7 x 6) 2.8e-4 apart after step 2, the third loss 3.1e-6 relative.
    So: the first loss exactly, and every loss to 1e-5 relative."""
    for rank in (0, 1):
        mine, ds = both[rank]["fused", "minitron"], both[rank]["fused", "deepspeed"]
        assert (mine["basic"], mine["aux"]) == (ds["basic"], ds["aux"]) == ("MuonWithAuxAdam", "FusedAdam")
        assert mine["losses"][0] == ds["losses"][0]
        assert mine["losses"] == pytest.approx(ds["losses"], rel=1e-5)
