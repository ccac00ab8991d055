"""minitron's GPTModel against Megatron-Core 0.19.2's own, weight for weight (marked mcore).

Megatron-Core is the yardstick: the same TransformerConfig fields and the same weights (the
state_dict names match, so minitron's state_dict loads into Megatron's model as it is) must
give the same logits, within 1e-5, for each model option minitron implements under Megatron's
name. Megatron's GPTModel is built from its *local* layer spec (no Transformer Engine, no apex)
in fp32 on the CPU; two things in it assume a GPU, and this test points them at the CPU:
``torch.cuda.current_device`` (asked while the layers are built) and the CUDA RNG tracker
(forked around the attention dropout, which is off here).

Needs the `mcore` extra, which needs Python >= 3.12; skipped with the reason where
megatron.core does not import. minitron itself never imports megatron.
"""

from __future__ import annotations

import socket
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.mcore
try:
    from megatron.core import parallel_state as mcore_parallel_state
    from megatron.core import tensor_parallel as mcore_tensor_parallel
    from megatron.core.fusions import fused_softmax as mcore_fused_softmax
    from megatron.core.models.gpt import GPTModel as McoreGPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as mcore_random
    from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig
except ImportError as exc:   # the whole module is skipped, saying how to get it
    pytest.skip(f"megatron.core does not import ({exc}): make a Python 3.12 venv and install "
                "torch==2.13.0, then megatron-core==0.19.2 with --no-deps (the mcore extra)",
                allow_module_level=True)

from minitron.core import parallel_state
from minitron.core.models.gpt import GPTModel
from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
from minitron.core.transformer import TransformerConfig

VOCAB, SEQ, BATCH, TOL = 64, 8, 2, 1e-5
SHAPE = dict(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
             hidden_dropout=0.0, attention_dropout=0.0)
SWIGLU = dict(gated_linear_unit=True, activation_func=F.silu)
CASES = {  # name: (TransformerConfig fields both take, GPTModel arguments both take)
    "gpt2": ({}, {}),
    "disable-bias-linear": (dict(add_bias_linear=False), {}),
    "qk-layernorm": (dict(qk_layernorm=True), {}),
    "norm-epsilon": (dict(layernorm_epsilon=0.5), {}),
    "apply-layernorm-1p": (dict(layernorm_zero_centered_gamma=True), {}),
    "llama": (dict(add_bias_linear=False, qk_layernorm=True, layernorm_epsilon=1e-6, normalization="RMSNorm",
                   num_query_groups=2, **SWIGLU), dict(position_embedding_type="rope",
                                                      share_embeddings_and_output_weights=False)),
    "llama-1p": (dict(add_bias_linear=False, layernorm_zero_centered_gamma=True, normalization="RMSNorm",
                      **SWIGLU), dict(position_embedding_type="rope")),
    # layer 1 through a 3-token window, layer 2 full (every 2nd layer skips the window)
    "sliding-window": (dict(window_size=(3, 0), window_attn_skip_freq=2), {}),
    "sliding-window-list": (dict(window_size=(2, 0), window_attn_skip_freq=[0, 1]), {}),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_rank(monkeypatch):
    """A world of one (gloo), with both libraries' model-parallel groups, CUDA pointed at the CPU."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda *a, **k: torch.get_rng_state())
    monkeypatch.setattr(torch.cuda, "manual_seed", torch.manual_seed)
    monkeypatch.setattr(mcore_random, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state())
    monkeypatch.setattr(mcore_random, "_set_cuda_rng_state", lambda state, *a, **k: torch.set_rng_state(state))
    # Megatron's torch softmax builds the sliding-window mask with device="cuda" spelled out.
    window_mask = mcore_fused_softmax.get_sliding_window_causal_mask
    ones = torch.ones

    def window_mask_on_cpu(*args):
        with mock.patch.object(torch, "ones", lambda *a, device=None, **k: ones(*a, **k)):
            return window_mask(*args)
    monkeypatch.setattr(mcore_fused_softmax, "get_sliding_window_causal_mask", window_mask_on_cpu)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    mcore_parallel_state.initialize_model_parallel(1, 1)
    parallel_state.initialize_model_parallel(1, 1)
    mcore_tensor_parallel.model_parallel_cuda_manual_seed(5)
    model_parallel_cuda_manual_seed(5)
    yield
    parallel_state.destroy_model_parallel()
    mcore_parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def _megatron_twin(fields, model_args, state):
    """Megatron-Core's GPTModel with minitron's weights ``state``.

    Megatron's torch norms (what the local spec uses without apex) refuse
    layernorm_zero_centered_gamma; apex's and TE's norms compute with ``1 + weight``. So the
    zero-centred case is held against Megatron's plain norm given ``1 + weight``, which is the
    function Megatron's 1p norms compute."""
    fields = dict(fields)
    one_p = fields.pop("layernorm_zero_centered_gamma", False)
    config = McoreConfig(**SHAPE, **fields, use_cpu_initialization=True, params_dtype=torch.float32)
    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization=config.normalization)
    model = McoreGPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                          **{"share_embeddings_and_output_weights": True, **model_args})
    if one_p:
        state = {k: v + 1 if "layernorm.weight" in k else v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, f"minitron has what Megatron's model does not: {unexpected}"
    assert all(k.endswith("_extra_state") for k in missing), f"minitron lacks {missing}"
    return model.eval()


@pytest.mark.parametrize("name", list(CASES))
def test_logits_equal_megatron_cores(one_rank, name):
    fields, model_args = CASES[name]
    config = TransformerConfig(**SHAPE, **fields, init_seed=3)
    model = nudged(GPTModel(config, VOCAB, SEQ, **{"share_embeddings_and_output_weights": True, **model_args}))
    assert_same_logits(name, model, _megatron_twin(fields, model_args, model.state_dict()))


def nudged(model):
    """The model in eval mode, every weight moved off its initial value (norms start at 1 or 0, biases at 0)."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())) * 0.1)
    return model.eval()


def assert_same_logits(name, model, twin):
    """minitron's model and Megatron's twin give the same logits on one causal batch, within TOL."""
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(SEQ).expand(BATCH, SEQ)
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1).expand(BATCH, 1, SEQ, SEQ)   # True: hidden
    with torch.no_grad():
        ours, theirs = model(ids, positions, causal), twin(ids, positions, causal)
    assert ours.shape == theirs.shape == (BATCH, SEQ, VOCAB)
    diff = (ours - theirs).abs().max().item()
    assert diff <= TOL, f"{name}: logits differ from Megatron-Core 0.19.2's by {diff:.2e}"
