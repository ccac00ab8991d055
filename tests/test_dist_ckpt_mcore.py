"""Megatron-Core 0.19.2 reads minitron's torch_dist checkpoint (marked mcore).

minitron's GPTModel (the llama case of test_mcore_peer.py: SwiGLU, grouped-query attention,
RMSNorm, rope, untied output) is saved with minitron.core.dist_checkpointing.save;
Megatron-Core's ``dist_checkpointing.load`` reads it into its own GPTModel's sharded state dict,
and the two models give the same logits. The keys, the layer axis and SwiGLU's two chunks per
rank are Megatron's, so Megatron needs no conversion.
"""

from __future__ import annotations

import pytest
import torch

from test_mcore_peer import BATCH, CASES, SEQ, SHAPE, TOL, VOCAB, one_rank  # noqa: F401 -- the fixture

pytestmark = pytest.mark.mcore
from megatron.core import dist_checkpointing as mcore_dist_checkpointing   # noqa: E402 -- after the skip
from megatron.core.models.gpt import GPTModel as McoreGPTModel   # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec   # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig   # noqa: E402

from minitron.core import dist_checkpointing   # noqa: E402
from minitron.core.models.gpt import GPTModel   # noqa: E402
from minitron.core.transformer import TransformerConfig   # noqa: E402


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_megatron_core_loads_a_minitron_torch_dist_checkpoint(one_rank, tmp_path, name):
    fields, model_args = CASES[name]
    model_args = {"share_embeddings_and_output_weights": True, **model_args}
    ours = GPTModel(TransformerConfig(**SHAPE, **fields, init_seed=3), VOCAB, SEQ, **model_args).eval()
    with torch.no_grad():   # move every weight off its initial value (norms start at 1, biases at 0)
        for param in ours.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())) * 0.1)
    dist_checkpointing.save(ours.sharded_state_dict(), tmp_path)

    config = McoreConfig(**SHAPE, **fields, use_cpu_initialization=True, params_dtype=torch.float32)
    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization=config.normalization)
    theirs = McoreGPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ, **model_args).eval()
    loaded, missing, unexpected = mcore_dist_checkpointing.load(theirs.sharded_state_dict(), str(tmp_path),
                                                                strict="return_all")
    # Megatron's words, from the checkpoint's side: "missing" = saved but not asked for,
    # "unexpected" = asked for but not saved.
    assert not missing, f"minitron wrote what Megatron's model does not ask for: {sorted(missing)}"
    assert unexpected and all(key.endswith("._extra_state") for key in unexpected), sorted(unexpected)
    theirs.load_state_dict(loaded, strict=False)

    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(SEQ).expand(BATCH, SEQ)
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1).expand(BATCH, 1, SEQ, SEQ)
    with torch.no_grad():
        diff = (ours(ids, positions, causal) - theirs(ids, positions, causal)).abs().max().item()
    assert diff <= TOL, f"{name}: Megatron-Core's logits after its load differ by {diff:.2e}"
