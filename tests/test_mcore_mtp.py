"""minitron's multi-token prediction against Megatron-Core 0.19.2's (marked mcore).

The same GPT with --mtp-num-layers D in both libraries (Megatron's local spec and its MTP block
spec for the last layer), the same weights (minitron's state_dict loads into Megatron's model
as it is: the keys are Megatron's, mtp.layers.k.{enorm,hnorm,eh_proj,mtp_model_layer,
final_layernorm}), one training forward with a loss mask: the main per-token loss, each depth's
logged MTP loss, and every parameter's gradient after backward (the MTP losses reach them
through MTPLossAutoScaler) agree within 1e-5. With experts the MTP layers are MoE layers like
the decoder's last, and their routers' balance losses are logged after the decoder's, as
Megatron logs them. One CPU rank, as tests/test_mcore_peer.py.
"""

from __future__ import annotations

import pytest
import torch
from test_mcore_moe import trackers  # noqa: F401  (a fixture: both MoE logs empty, scales 1)
from test_mcore_peer import BATCH, SEQ, SHAPE, VOCAB, nudged, one_rank  # noqa: F401  (one_rank: a fixture)

pytestmark = pytest.mark.mcore
from megatron.core.models.gpt import GPTModel as McoreGPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec  # noqa: E402
from megatron.core.transformer import multi_token_prediction as mcore_mtp  # noqa: E402
from megatron.core.transformer.moe import moe_logging as mcore_logging  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig  # noqa: E402

from minitron.core.models.gpt import GPTModel  # noqa: E402
from minitron.core.transformer import TransformerConfig  # noqa: E402
from minitron.core.transformer import multi_token_prediction as mtp  # noqa: E402
from minitron.core.transformer.moe import moe_logging  # noqa: E402

CASES = {   # name: (TransformerConfig fields both take, GPTModel arguments both take)
    "one-depth-untied": (dict(mtp_num_layers=1), dict(share_embeddings_and_output_weights=False)),
    "two-depths-tied-scaled": (dict(mtp_num_layers=2, mtp_loss_scaling_factor=0.3), {}),
    "llama-two-depths": (dict(mtp_num_layers=2, add_bias_linear=False, normalization="RMSNorm",
                              gated_linear_unit=True, activation_func=torch.nn.functional.silu),
                         dict(share_embeddings_and_output_weights=False)),
    # --calculate-per-token-loss: each depth's sum weighted back to its own token count
    "per-token-loss": (dict(mtp_num_layers=2, calculate_per_token_loss=True), {}),
    # DeepSeek-V3's shape: every layer MoE (the MTP ones too), the balance loss on
    "moe-two-depths": (dict(mtp_num_layers=2, num_moe_experts=4, moe_router_topk=2, moe_aux_loss_coeff=1e-2,
                            add_bias_linear=False, moe_token_dispatcher_type="allgather"), {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_mtp_loss_and_gradients_equal_megatron_cores(one_rank, trackers, name):
    fields, model_args = CASES[name]
    model_args = {"position_embedding_type": "rope", "share_embeddings_and_output_weights": True, **model_args}
    ours = nudged(GPTModel(TransformerConfig(**SHAPE, **fields, init_seed=3), VOCAB, SEQ, **model_args)).train()
    config = McoreConfig(**SHAPE, **fields, use_cpu_initialization=True, params_dtype=torch.float32)
    spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=False,
                                    normalization=config.normalization)
    theirs = McoreGPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                           mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False),
                           **model_args).train()
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    loss_mask = torch.ones(BATCH, SEQ).index_fill_(1, torch.tensor([2]), 0.0)   # one masked column
    positions = torch.arange(SEQ).expand(BATCH, SEQ)
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1).expand(BATCH, 1, SEQ, SEQ)
    mtp._MTP_TRACKER.clear()
    mcore_mtp.MTPLossLoggingHelper.tracker.clear()
    mtp.MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0))
    mcore_mtp.MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0))
    out = {}
    for who, model in (("ours", ours), ("theirs", theirs)):
        loss = model(ids, positions, causal, labels=labels, loss_mask=loss_mask)
        (loss * loss_mask).sum().backward()
        out[who] = (loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    (l1, g1), (l2, g2) = out["ours"], out["theirs"]
    assert (l1 - l2).abs().max() <= 1e-5, f"{name}: main loss differs"
    logged = mcore_mtp.MTPLossLoggingHelper.tracker["loss_values"]
    assert torch.allclose(torch.stack([mtp._MTP_TRACKER[k] for k in range(fields["mtp_num_layers"])]), logged,
                          atol=1e-5), name
    assert g1.keys() == g2.keys(), set(g1) ^ set(g2)
    worst = max((g1[k] - g2[k]).abs().max().item() for k in g1)
    assert worst <= 1e-5, f"{name}: gradients differ from Megatron-Core 0.19.2's by {worst:.2e}"
    assert g1["mtp.layers.0.eh_proj.weight"].abs().sum() > 0
    theirs_moe = {k: v.values for k, v in mcore_logging.get_moe_metrics_tracker().metrics.items()}
    assert theirs_moe.keys() == moe_logging._MOE_LAYER_WISE_LOGGING_TRACKER.keys()
    if "moe" in name:   # the MTP layers' routers logged in slots 3 and 4
        assert theirs_moe["load_balancing_loss"][2:].abs().min() > 0
    for key, values in theirs_moe.items():   # [decoder layers..., MTP layers...]
        assert torch.allclose(moe_logging._MOE_LAYER_WISE_LOGGING_TRACKER[key], values.float(), atol=1e-5), key


FLOPS_MODEL = ["--num-layers", "3", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
               "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "1", "--lr", "1e-3",
               "--mock-data", "--vocab-size", "256", "--position-embedding-type", "rope", "--swiglu",
               "--disable-bias-linear"]


@pytest.mark.parametrize("extra", [["--mtp-num-layers", "2"],
                                   ["--mtp-num-layers", "1", "--num-experts", "8", "--moe-router-topk", "2",
                                    "--moe-ffn-hidden-size", "32"]], ids=["dense", "moe"])
def test_flops_equal_megatron_trainings_count(extra):
    """theoretical_flops counts the MTP layers (like the decoder's last), their norms and
    projection and their logits as Megatron's training.num_floating_point_operations does."""
    from megatron.training.training import num_floating_point_operations as megatron_flops
    from test_estimate import estimate_args

    from minitron.training.theoretical_flops import num_floating_point_operations

    args = estimate_args(1, *FLOPS_MODEL, *extra)

    class Theirs:   # minitron's arguments; Megatron's options minitron lacks read as unset (None)
        def __init__(self):
            self.__dict__.update(vars(args), is_hybrid_model=False, multi_latent_attention=False)

        def __getattr__(self, name):
            return None

    assert num_floating_point_operations(args, 2) == megatron_flops(Theirs(), 2)
