"""Megatron-Core 0.19.2 reads minitron's torch_dist checkpoints, and minitron Megatron's (marked mcore).

minitron's GPTModel (the gpt2 and llama cases of test_mcore_peer.py: SwiGLU, grouped-query
attention, RMSNorm, rope, untied output) is saved with minitron.core.dist_checkpointing.save;
Megatron-Core's ``dist_checkpointing.load`` reads it into its own GPTModel's sharded state dict,
and the two models give the same logits. The keys, the layer axis and SwiGLU's two chunks per
rank are Megatron's, so Megatron needs no conversion.

MoE: Megatron-Core stores an MoE layer's experts as one tensor per linear with an axis of all E
experts after the layer axis (``decoder.layers.mlp.experts.experts.linear_fc1.weight``, shaped
(num_layers, E, ffn, h)); its SequentialMLP and TEGroupedMLP write the same keys, and so do
minitron's experts (moe/experts.py), sequential or grouped (--moe-grouped-gemm). Held against
Megatron's own model (its local spec: SequentialMLP):

1. minitron saves on one rank, Megatron loads: the same logits and router outputs.
2. minitron saves at expert-parallel size 2 (two forked ranks, experts 0-1 and 2-3): Megatron
   on one rank reads all four from their places on the expert axis; the same logits.
3. Megatron saves, minitron loads (strict): the same logits.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from test_mcore_peer import BATCH, CASES, SEQ, SHAPE, TOL, VOCAB, one_rank  # noqa: F401 -- the fixture

pytestmark = pytest.mark.mcore
from megatron.core import dist_checkpointing as mcore_dist_checkpointing   # noqa: E402 -- after the skip
from megatron.core.models.gpt import GPTModel as McoreGPTModel   # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec   # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig   # noqa: E402

from minitron.core import dist_checkpointing   # noqa: E402
from minitron.core.models.gpt import GPTModel   # noqa: E402
from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed   # noqa: E402
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


# --- MoE --------------------------------------------------------------------------------------

MOE = dict(num_moe_experts=4, moe_router_topk=2, moe_token_dispatcher_type="allgather")
MOE_CASES = {   # name: TransformerConfig fields both take
    # GPT-2's layers, experts with biases (Megatron's default --add-bias-linear)
    "biased-experts": dict(MOE),
    # Mixtral / DeepSeek-like: gated experts, RMSNorm, a shared expert, sigmoid routing with an expert bias
    "gated-shared-expert-bias": dict(MOE, gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
                                     normalization="RMSNorm", moe_shared_expert_intermediate_size=24,
                                     moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True),
}


def _ours(fields, grouped: bool = False, seed: int = 3) -> GPTModel:
    """minitron's model, every weight (and the router's expert bias) off its initial value."""
    ours = GPTModel(TransformerConfig(**SHAPE, **fields, moe_grouped_gemm=grouped, init_seed=seed),
                    VOCAB, SEQ).eval()
    with torch.no_grad():   # the same nudge whichever rank holds the expert: seeded by name
        for name, param in ours.named_parameters():
            gen = torch.Generator().manual_seed(sum(map(ord, name)) * 31 + param.numel() + seed)
            param.add_(torch.randn(param.shape, generator=gen) * 0.1)
        for name, buffer in ours.named_buffers():
            if name.endswith("expert_bias"):
                buffer.copy_(torch.tensor([0.0, 0.3, -0.2, 0.1]))
    return ours


def _theirs(fields) -> McoreGPTModel:
    config = McoreConfig(**SHAPE, **fields, use_cpu_initialization=True, params_dtype=torch.float32)
    spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, normalization=config.normalization)
    return McoreGPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ).eval()


def _inputs():
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(SEQ).expand(BATCH, SEQ)
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1).expand(BATCH, 1, SEQ, SEQ)
    return ids, positions, causal


def _logits(model):
    with torch.no_grad():
        return model(*_inputs())


def _megatron_loads(fields, where) -> McoreGPTModel:
    theirs = _theirs(fields)
    loaded, missing, unexpected = mcore_dist_checkpointing.load(theirs.sharded_state_dict(), str(where),
                                                                strict="return_all")
    # Megatron's words, from the checkpoint's side: "missing" = saved but not asked for,
    # "unexpected" = asked for but not saved.
    assert not missing, f"minitron wrote what Megatron's model does not ask for: {sorted(missing)}"
    assert unexpected and all(key.endswith("._extra_state") for key in unexpected), sorted(unexpected)
    theirs.load_state_dict(loaded, strict=False)
    return theirs


@pytest.mark.parametrize("grouped", [False, True], ids=["sequential", "grouped"])
@pytest.mark.parametrize("name", list(MOE_CASES))
def test_megatron_core_loads_a_minitron_moe_checkpoint(one_rank, tmp_path, name, grouped):
    ours = _ours(MOE_CASES[name], grouped)
    dist_checkpointing.save(ours.sharded_state_dict(), tmp_path)
    theirs = _megatron_loads(MOE_CASES[name], tmp_path)
    diff = (_logits(ours) - _logits(theirs)).abs().max().item()
    assert diff <= TOL, f"{name}: Megatron-Core's logits after its load differ by {diff:.2e}"
    hidden = torch.randn(SEQ, BATCH, SHAPE["hidden_size"], generator=torch.Generator().manual_seed(2))
    for mine, its in zip(ours.decoder.layers, theirs.decoder.layers):
        with torch.no_grad():
            (p1, m1), (p2, m2) = mine.mlp.router(hidden), its.mlp.router(hidden)
        assert torch.equal(m1, m2) and (p1 - p2).abs().max() <= TOL, f"{name}: the routers differ"


@pytest.fixture(scope="module")
def saved_at_ep2(tmp_path_factory):
    """minitron's model at expert-parallel size 2 on two forked ranks: (checkpoint, logits).
    A module fixture, so that it forks before the test's one-rank groups start in this process."""
    from distributed import run_ranks

    where = tmp_path_factory.mktemp("moe_ep2")

    def body(rank):
        model_parallel_cuda_manual_seed(5)
        ours = _ours(MOE_CASES["gated-shared-expert-bias"])
        assert len(ours.decoder.layers[0].mlp.experts.local_experts) == 2   # experts 2r, 2r + 1
        dist_checkpointing.save(ours.sharded_state_dict(), where)
        return _logits(ours)
    logits = run_ranks(body, world_size=2, ep=2)
    assert torch.equal(logits[0], logits[1])
    return where, logits[0]


def test_megatron_core_reads_experts_saved_at_expert_parallel_size_2(saved_at_ep2, one_rank):
    where, logits = saved_at_ep2
    theirs = _megatron_loads(MOE_CASES["gated-shared-expert-bias"], where)
    diff = (logits - _logits(theirs)).abs().max().item()
    assert diff <= TOL, f"Megatron-Core at ep 1 reads minitron's ep 2 experts with logits {diff:.2e} off"


@pytest.mark.parametrize("name", list(MOE_CASES))
def test_minitron_loads_a_megatron_core_moe_checkpoint(one_rank, monkeypatch, tmp_path, name):
    # Megatron's writer copies the tensors to the host and waits for the GPU (there is none), and
    # logs its memory through psutil, which the --no-deps install of the mcore extra lacks.
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    monkeypatch.setattr(filesystem_async, "_process_memory", lambda: 0)
    theirs = _theirs(MOE_CASES[name])
    with torch.no_grad():   # its own weights, moved by ours: minitron's model starts elsewhere
        theirs.load_state_dict(_ours(MOE_CASES[name], seed=7).state_dict(), strict=False)
    mcore_dist_checkpointing.save(theirs.sharded_state_dict(), str(tmp_path))
    ours = _ours(MOE_CASES[name], seed=11)
    loaded = dist_checkpointing.load(ours.sharded_state_dict(), tmp_path)
    ours.load_state_dict(loaded, strict=False)
    diff = (_logits(ours) - _logits(theirs)).abs().max().item()
    assert diff <= TOL, f"{name}: minitron's logits after reading Megatron's checkpoint differ by {diff:.2e}"
