"""minitron's YaRN rope against Megatron-Core 0.19.2's YarnRotaryEmbedding (marked mcore).

Three holds: the angles and the concentration factor alone, for parameters that put the blend
of kept and slowed channels inside the head; a GPT with --position-embedding-type yarn (its
attention multiplies cos and sin by the factor), Megatron's config given the yarn_* attributes
its training sets; and MLA with its default rope type, yarn, where mscale_all_dim also enters
the softmax scale. Logits within test_mcore_peer's 1e-5.
"""

from __future__ import annotations

import pytest
import torch

from test_mcore_peer import SEQ, SHAPE, VOCAB, assert_same_logits, nudged, one_rank  # noqa: F401

pytestmark = pytest.mark.mcore
try:
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
        YarnRotaryEmbedding as McoreYarn)
    from megatron.core.models.gpt import GPTModel as McoreGPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig
except ImportError as exc:
    pytest.skip(f"megatron.core does not import ({exc})", allow_module_level=True)

from test_mcore_mla import _models as mla_models

from minitron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding
from minitron.core.models.gpt import GPTModel
from minitron.core.transformer import TransformerConfig

# A context of 16 stretched 4 times: with these betas the blend falls inside an 8-channel head.
YARN = dict(scaling_factor=4.0, original_max_position_embeddings=16, beta_fast=4.0, beta_slow=0.5,
            mscale=0.9, mscale_all_dim=0.3)


@pytest.mark.parametrize("round_to_int", [True, False])
def test_angles_and_mscale_equal_megatron_cores(monkeypatch, round_to_int):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    ours = YarnRotaryEmbedding(16, rotary_base=100, correction_range_round_to_int=round_to_int, **YARN)
    theirs = McoreYarn(16, rotary_base=100, correction_range_round_to_int=round_to_int,
                       use_cpu_initialization=True, **YARN)
    (emb, mscale), (memb, mmscale) = ours(40), theirs(40)
    assert torch.equal(emb, memb) and mscale == mmscale != 1.0
    # the blend is real: some channels kept, some slowed, some between
    ratio = ours.yarn_inv_freq() / ours.inv_freq_extra
    assert ratio.max() == 1.0 and ratio.min() == 0.25 and ((ratio > 0.25) & (ratio < 1)).any()


def test_gpt_with_yarn_positions_gives_megatron_cores_logits(one_rank):
    fields = dict(add_bias_linear=False, normalization="RMSNorm")
    yarn = {f"yarn_{k}" if k != "scaling_factor" else "yarn_rotary_scaling_factor": v for k, v in YARN.items()}
    ours = nudged(GPTModel(TransformerConfig(**SHAPE, **fields, **yarn, init_seed=3), VOCAB, SEQ,
                           position_embedding_type="yarn", share_embeddings_and_output_weights=True))
    assert ours.decoder.layers[0].self_attention._yarn_concentration_factor != 1.0
    # Megatron's training sets these on its config (_apply_yarn_config_from_args); they are no fields there.
    mconfig = McoreConfig(**SHAPE, **fields, use_cpu_initialization=True, params_dtype=torch.float32)
    for name, value in {**yarn, "yarn_correction_range_round_to_int": True}.items():
        setattr(mconfig, name, value)
    theirs = McoreGPTModel(mconfig, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=VOCAB,
                           max_sequence_length=SEQ, position_embedding_type="yarn",
                           share_embeddings_and_output_weights=True).eval()
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
    assert_same_logits("yarn", ours, theirs)


def test_mla_with_its_default_yarn_gives_megatron_cores_logits(one_rank):
    yarn = dict(rope_type="yarn", rotary_scaling_factor=40.0, original_max_position_embeddings=16,
                beta_fast=4.0, beta_slow=0.5, mscale=0.8, mscale_all_dim=0.6)
    ours, theirs = mla_models(yarn, dict(position_embedding_type="rope"))
    assert ours.decoder.layers[0].self_attention.softmax_scale == theirs.decoder.layers[0].self_attention.softmax_scale
    assert TransformerConfig.rope_type == "yarn"   # Megatron's MLA default, which the config keeps
    theirs.load_state_dict(ours.state_dict(), strict=False)
    assert_same_logits("mla-yarn", ours, theirs)
