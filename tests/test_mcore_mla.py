"""minitron's multi-latent attention against Megatron-Core 0.19.2's MLASelfAttention (marked mcore).

The same weights (minitron's state_dict, loaded into Megatron's GPTModel built with its local
MLA layer spec and an MLATransformerConfig) must give the same logits within 1e-5, and both
models must name and shape every parameter alike. Megatron's MLA defaults to YaRN rope; these
cases pass rope_type "rope", the one minitron implements. The one-rank world and the CPU
stand-ins for CUDA are test_mcore_peer's fixture.
"""

from __future__ import annotations

import pytest
import torch

from test_mcore_peer import SEQ, VOCAB, assert_same_logits, nudged, one_rank  # noqa: F401  (one_rank: the fixture)

pytestmark = pytest.mark.mcore
try:
    from megatron.core.models.gpt import GPTModel as McoreGPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.dot_product_attention import DotProductAttention as McoreDotProductAttention
    from megatron.core.transformer.transformer_config import MLATransformerConfig
except ImportError as exc:
    pytest.skip(f"megatron.core does not import ({exc})", allow_module_level=True)

from minitron.core.models.gpt import GPTModel
from minitron.core.transformer import TransformerConfig

SHAPE = dict(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, hidden_dropout=0.0,
             attention_dropout=0.0, multi_latent_attention=True, kv_lora_rank=12, qk_head_dim=8,
             qk_pos_emb_head_dim=4, v_head_dim=6, rope_type="rope", q_lora_rank=None, normalization="RMSNorm")
CASES = {   # name: (config fields, GPTModel arguments)
    "no q compression": ({}, dict(position_embedding_type="rope")),
    "q_lora_rank, latent norms (DeepSeek-V2)": (dict(q_lora_rank=10, qk_layernorm=True, add_bias_linear=False,
                                                    rotary_base=500), dict(position_embedding_type="rope")),
    "learned positions too, rotary_percent": (dict(q_lora_rank=10, rotary_percent=0.5), {}),
}


class _LocalCoreAttention(McoreDotProductAttention):
    """Megatron's local core attention, which its own MLA spec cannot build in 0.19.2: MLASelfAttention
    passes k_channels / v_channels, which only Transformer Engine's attention takes. The local one
    reads the head sizes off config.kv_channels (set to v_head_dim below: it only shapes the
    output) and gets MLA's softmax scale passed in, so dropping the two arguments is faithful."""

    def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
        super().__init__(*args, **kwargs)


def _models(fields, model_args):
    fields = {**SHAPE, **fields}   # MLATransformerConfig's own q_lora_rank default is 512: say None
    config = TransformerConfig(**fields, init_seed=3)
    ours = nudged(GPTModel(config, VOCAB, SEQ, share_embeddings_and_output_weights=True, **model_args))
    mconfig = MLATransformerConfig(**fields, kv_channels=SHAPE["v_head_dim"],
                                   use_cpu_initialization=True, params_dtype=torch.float32)
    spec = get_gpt_layer_local_spec(qk_layernorm=mconfig.qk_layernorm, multi_latent_attention=True,
                                    normalization=mconfig.normalization)
    spec.submodules.self_attention.submodules.core_attention = _LocalCoreAttention
    theirs = McoreGPTModel(mconfig, spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                           share_embeddings_and_output_weights=True, **model_args).eval()
    return ours, theirs


@pytest.mark.parametrize("name", list(CASES))
def test_mla_logits_and_state_dict_equal_megatron_cores(one_rank, name):
    ours, theirs = _models(*CASES[name])
    mine = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    megatrons = {k: tuple(v.shape) for k, v in theirs.state_dict().items() if not k.endswith("_extra_state")}
    assert mine == megatrons, f"{name}: state_dict names/shapes differ: {set(mine) ^ set(megatrons)}"
    theirs.load_state_dict(ours.state_dict(), strict=False)
    assert_same_logits(name, ours, theirs)


@pytest.mark.parametrize("name", list(CASES))
def test_mla_checkpoint_keys_equal_megatron_cores(one_rank, name):
    """torch_dist's keys (sharded_state_dict): Megatron's local MLA spec keeps ``input_layernorm.``
    and ``pre_mlp_layernorm.`` (its dense spec renames them after TE's fused layers; the MLA one
    has no such map), so a minitron MLA checkpoint must keep them too for Megatron to read it."""
    ours, theirs = _models(*CASES[name])

    def keys(sharded):   # the checkpoint's keys (each piece's .key), not the dict's module paths
        return {v.key for v in sharded.values() if not v.key.endswith("_extra_state")}
    mine, megatrons = keys(ours.sharded_state_dict()), keys(theirs.sharded_state_dict())
    assert mine == megatrons, f"{name}: only minitron's {sorted(mine - megatrons)}; only Megatron's {sorted(megatrons - mine)}"
