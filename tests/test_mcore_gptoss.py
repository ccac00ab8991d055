"""gpt-oss's, Qwen 2.5's, Nemotron's and Llama 4's layer variants against Megatron-Core 0.19.2 (marked mcore).

The same TransformerConfig fields and minitron's weights, loaded into Megatron's GPTModel with
its local layer spec, give the same logits within 1e-5, and both name and shape every
parameter alike (the learnable sink is ``core_attention.softmax_offset``, one per head).
"""

from __future__ import annotations

import pytest

from test_mcore_peer import _megatron_twin, assert_same_logits, nudged, one_rank  # noqa: F401
from test_mcore_peer import SEQ, SHAPE, VOCAB

pytestmark = pytest.mark.mcore
try:
    from megatron.core.activations import quick_gelu as mcore_quick_gelu
    from megatron.core.activations import squared_relu as mcore_squared_relu
    from megatron.core.models.gpt import GPTModel as McoreGPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig
except ImportError as exc:
    pytest.skip(f"megatron.core does not import ({exc})", allow_module_level=True)

import torch

from minitron.core.activations import quick_gelu, squared_relu
from minitron.core.models.gpt import GPTModel
from minitron.core.transformer import TransformerConfig

GPT_OSS = dict(softmax_type="learnable", gated_linear_unit=True, glu_linear_offset=1.0,
               activation_func_clamp_value=0.7, add_bias_linear=False, num_query_groups=2,
               normalization="RMSNorm", window_size=(3, 0), window_attn_skip_freq=2)
CASES = {   # name: (fields, minitron's activation, Megatron's)
    "gpt-oss": (GPT_OSS, quick_gelu, mcore_quick_gelu),
    "qwen2.5 (qkv bias alone)": (dict(add_bias_linear=False, add_qkv_bias=True, num_query_groups=2), None, None),
    "nemotron (squared relu), off-by-one sinks": (dict(softmax_type="off-by-one"), squared_relu, mcore_squared_relu),
}


@pytest.mark.parametrize("name", list(CASES))
def test_layer_variants_give_megatron_cores_logits(one_rank, name):
    fields, ours_act, their_act = CASES[name]
    ours = nudged(GPTModel(TransformerConfig(**SHAPE, **fields, init_seed=3,
                                             **({"activation_func": ours_act} if ours_act else {})),
                           VOCAB, SEQ, position_embedding_type="rope", share_embeddings_and_output_weights=True))
    state = ours.state_dict()
    theirs = _megatron_twin({**fields, **({"activation_func": their_act} if their_act else {})},
                            dict(position_embedding_type="rope"), state)
    megatrons = {k: tuple(v.shape) for k, v in theirs.state_dict().items() if not k.endswith("_extra_state")}
    assert {k: tuple(v.shape) for k, v in state.items()} == megatrons
    assert_same_logits(name, ours, theirs)


@pytest.mark.parametrize("no_rope_freq", [2, [1, 0]])
def test_llama4_qk_l2_norm_and_nope_layers_give_megatron_cores_logits(one_rank, no_rope_freq):
    """Megatron's local spec takes qk_l2_norm as an argument (its L2Norm in the q/k norm slots)."""
    fields = dict(qk_l2_norm=True, add_bias_linear=False, normalization="RMSNorm", num_query_groups=2)
    ours = nudged(GPTModel(TransformerConfig(**SHAPE, **fields, no_rope_freq=no_rope_freq, init_seed=3), VOCAB, SEQ,
                           position_embedding_type="rope", share_embeddings_and_output_weights=True))
    mconfig = McoreConfig(**SHAPE, **fields, no_rope_freq=no_rope_freq, use_cpu_initialization=True,
                          params_dtype=torch.float32)
    theirs = McoreGPTModel(mconfig, get_gpt_layer_local_spec(qk_l2_norm=True, normalization="RMSNorm"),
                           vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope",
                           share_embeddings_and_output_weights=True).eval()
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
    assert_same_logits(f"llama-4 no_rope_freq={no_rope_freq}", ours, theirs)
