"""minitron's bf16 GPT at 4096 positions against Megatron-Core 0.19.2's (marked mcore).

Both models are cast whole by their Float16Module, and both keep rope's inv_freq out of that
cast: the logits of the same bf16 weights agree to bf16's rounding at every position, the far
ones included, where angles computed in bf16 would turn tokens by the wrong angle. The fixture
and the CPU patches are test_mcore_peer.py's; the model is tiny so that 4096 positions (a
[2, 4096, 4096] score matrix per layer) take about a second.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.mcore
try:
    from megatron.core.models.gpt import GPTModel as McoreGPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.module import Float16Module as McoreFloat16Module
    from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig
except ImportError as exc:
    pytest.skip(f"megatron.core does not import ({exc}): see tests/test_mcore_peer.py", allow_module_level=True)

from test_mcore_peer import nudged, one_rank  # noqa: F401 (a fixture)

from minitron.core.models.gpt import GPTModel
from minitron.core.transformer import TransformerConfig
from minitron.core.transformer.module import Float16Module

VOCAB, SEQ = 64, 4096
SHAPE = dict(num_layers=2, hidden_size=64, num_attention_heads=2, ffn_hidden_size=128,
             hidden_dropout=0.0, attention_dropout=0.0)
# The libraries round to bf16 at different places (torch's fused attention here; Megatron's
# bf16 scores, fp32 softmax, bf16 probabilities there), and peaked attention (below) magnifies
# a rounded score: measured 0.11 apart, 7 of bf16's units at logits of 2 to 4. Angles computed
# in bf16, as minitron's were, put them 3.2 apart. 0.4 sits a factor 3.5 clear of the one and
# 8 of the other.
TOL = 0.4


def _peaked(model):
    """linear_qkv's weights doubled: scores 4x larger, each token attends to a few others. With
    the flat attention of small random weights a token sees the mean of all 4096 before it,
    and no angle, right or wrong, changes a mean (bf16 angles then move the logits by 0.2)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("linear_qkv.weight"):
                param.mul_(2)
    return model


def test_bf16_logits_at_4096_positions_equal_megatron_cores(one_rank):
    config = TransformerConfig(**SHAPE, params_dtype=torch.bfloat16, init_seed=3)
    ours = Float16Module(config, _peaked(nudged(GPTModel(config, VOCAB, SEQ, position_embedding_type="rope"))))
    twin_config = McoreConfig(**SHAPE, bf16=True, params_dtype=torch.bfloat16, use_cpu_initialization=True)
    twin = McoreFloat16Module(twin_config, McoreGPTModel(twin_config, get_gpt_layer_local_spec(), vocab_size=VOCAB,
                                                         max_sequence_length=SEQ, position_embedding_type="rope"))
    missing, unexpected = twin.module.load_state_dict(ours.state_dict(), strict=False)   # bf16 into bf16
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
    twin.eval()
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(SEQ)[None]
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)[None, None]   # True: hidden
    with torch.no_grad():
        logits, theirs = ours(ids, positions, causal), twin(ids, positions, causal)
    assert logits.dtype == theirs.dtype == torch.float32 and logits.shape == theirs.shape == (1, SEQ, VOCAB)
    diff = (logits - theirs).abs().max().item()
    assert diff <= TOL, f"bf16 logits differ from Megatron-Core 0.19.2's by {diff:.3f} (scale {theirs.abs().max():.1f})"
