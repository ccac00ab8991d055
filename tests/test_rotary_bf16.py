"""What Float16Module must leave in fp32: rope's angles, and the router's expert bias.

A bf16 number has 8 bits of mantissa, so it counts integers exactly only up to 256; from
there on it skips. Rope's angle for position m in its fastest channel is m itself (θ_0 = 1),
so a table computed in bf16 has 769 distinct positions out of 4096 and angle errors of up to
16 radians: distant tokens would be rotated as if they were others. Megatron keeps
``inv_freq`` in fp32 outside the module's buffers, computes the angles and their cos/sin in
fp32 and casts only the cos/sin, to the activations' dtype, where they multiply q and k.
Its router likewise restores the expert bias to fp32 before it is used, loaded or saved.
"""

from __future__ import annotations

import torch

from distributed import run_ranks
from minitron.core.models.common.embeddings import rotary_pos_embedding
from minitron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding, apply_rotary_pos_emb
from minitron.core.transformer import TransformerConfig
from minitron.core.transformer.module import Float16Module

SEQ = 4096
BF16 = dict(num_layers=1, hidden_size=64, num_attention_heads=2, params_dtype=torch.bfloat16, init_seed=1)


def test_bf16_rotary_angles_are_the_fp32_ones():
    config = TransformerConfig(**BF16)
    fp32_angles = RotaryEmbedding(config.kv_channels)(SEQ)
    rotary = Float16Module(config, RotaryEmbedding(config.kv_channels)).module
    angles = rotary(SEQ)
    assert rotary.inv_freq.dtype == angles.dtype == torch.float32
    # The same fp32 arithmetic on the same inputs: bit-equal is the promise, no tolerance.
    assert torch.equal(angles, fp32_angles)
    fastest = angles[:, 0, 0, 0]                       # θ_0 = 1: the angle is the position
    assert torch.equal(fastest, torch.arange(SEQ, dtype=torch.float32))
    assert fastest.unique().numel() == SEQ


def test_inv_freq_is_made_on_the_ranks_device(monkeypatch):
    # A plain attribute does not follow module.to(device): it must be born where the rank
    # computes. "meta" stands in for a GPU, so that a CPU run sees where it was put.
    class Meta:
        def current_device_name(self):
            return "meta"
    monkeypatch.setattr(rotary_pos_embedding, "get_accelerator", Meta)
    rotary = RotaryEmbedding(32, rope_scaling=True)
    assert rotary.inv_freq.device.type == rotary(SEQ).device.type == "meta"


def test_rotation_casts_the_angles_only_at_the_point_of_use():
    # bf16 q (|q| <= 1) turned by fp32 angles, against the fp32 rotation of the same q: what
    # separates them is bf16's rounding of cos and sin (2^-9 relative), of the two products
    # (2^-9 each, half a unit in [0.5, 1)) and of their sum (2^-8, half a unit below 2): at
    # most 2^-7 + 2^-8 < 2^-6. Had cos and sin been taken of bf16 angles, positions past 256
    # would be turned by angles radians off, an error of the order of |q| itself.
    q = (torch.rand(SEQ, 1, 2, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1).bfloat16()
    freqs = RotaryEmbedding(32)(SEQ)
    rotated = apply_rotary_pos_emb(q, freqs)
    assert rotated.dtype == torch.bfloat16
    error = (rotated.float() - apply_rotary_pos_emb(q.float(), freqs)).abs().max().item()
    assert error <= 2 ** -6, f"bf16 rotation is {error:.4f} off the fp32 one"


def _bf16_gpt(rank: int):
    from minitron.core.models.gpt import GPTModel
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed

    torch.set_num_threads(1)   # a lone forked rank: keep off torch's OpenMP pool
    model_parallel_cuda_manual_seed(1)
    plain = GPTModel(TransformerConfig(**{**BF16, "params_dtype": torch.float32}), 64, SEQ,
                     position_embedding_type="rope")
    config = TransformerConfig(**BF16)
    wrapped = Float16Module(config, GPTModel(config, 64, SEQ, position_embedding_type="rope"))
    assert torch.equal(wrapped.module.rotary_pos_emb(SEQ), plain.rotary_pos_emb(SEQ))
    # inv_freq was never saved (Megatron's neither): the checkpoint's keys are unchanged.
    assert wrapped.state_dict().keys() == plain.state_dict().keys()
    assert not [key for key in plain.state_dict() if "inv_freq" in key]


def test_bf16_gpt_rotates_by_fp32_angles_and_saves_the_same_keys():
    run_ranks(_bf16_gpt, world_size=1)


def test_bf16_router_keeps_a_loaded_expert_bias_exact():
    from minitron.core.transformer.moe.router import TopKRouter

    config = TransformerConfig(**BF16, num_moe_experts=4, moe_router_topk=2, moe_router_score_function="sigmoid",
                               moe_router_enable_expert_bias=True, moe_router_load_balancing_type="none")
    router = Float16Module(config, TopKRouter(config)).module
    state = router.state_dict()
    # 1 + k·2^-12 is between two bf16 numbers (spacing 2^-7 near 1): bf16 would round it off.
    state["expert_bias"] = 1 + torch.arange(1, 5, dtype=torch.float32) * 2 ** -12
    router.load_state_dict(state)
    assert router.expert_bias.dtype == torch.float32
    assert torch.equal(router.expert_bias, state["expert_bias"])
    assert torch.equal(router.state_dict()["expert_bias"], state["expert_bias"])
