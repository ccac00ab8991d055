"""--moe-layer-freq as Megatron takes it: N, or a 0/1 list per layer (DeepSeek's ([0]+[1]*26)),
read by one function for the model, the accountant and the FLOP count."""

from __future__ import annotations

from distributed import run_ranks
from minitron.core.layer_patterns import moe_layer_pattern
from minitron.training.arguments_ranges import layer_pattern


def test_an_int_and_a_list_name_the_same_layers():
    assert moe_layer_pattern(2, 5) == [1, 0, 1, 0, 1]
    assert moe_layer_pattern(layer_pattern("([0]+[1]*2)"), 3) == [0, 1, 1]


def _routers(rank):
    """Which layers of a model built with --moe-layer-freq [0,1,1] got an MoE layer."""
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.core.transformer import TransformerConfig
    from minitron.core.transformer.transformer_block import TransformerBlock

    model_parallel_cuda_manual_seed(1)
    config = TransformerConfig(num_layers=3, hidden_size=16, num_attention_heads=2, num_moe_experts=2,
                               moe_router_topk=1, moe_layer_freq=[0, 1, 1], add_bias_linear=False)
    return [hasattr(layer.mlp, "router") for layer in TransformerBlock(config).layers]


def test_the_model_puts_experts_where_the_list_says():
    assert run_ranks(_routers, world_size=1)[0] == [False, True, True]
