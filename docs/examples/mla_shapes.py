"""Chapter 8's run of multi-latent attention: one layer at DeepSeek-V2-Lite's sizes, its shapes.

    python docs/examples/mla_shapes.py

Builds minitron's MLASelfAttention with DeepSeek-V2-Lite's attention sizes (hidden 2048, 16
heads, --kv-lora-rank 512, --qk-head-dim 128, --qk-pos-emb-head-dim 64, --v-head-dim 128, no
query compression), runs 4 tokens through it on one rank, and prints the shape each
projection hands on, then what an inference KV cache would keep per token, from those shapes.
"""

from __future__ import annotations

import tempfile

import torch

from minitron.core import parallel_state
from minitron.core.transformer import TransformerConfig
from minitron.core.transformer.multi_latent_attention import MLASelfAttention

V2_LITE = dict(num_layers=27, hidden_size=2048, num_attention_heads=16, ffn_hidden_size=10944,
               multi_latent_attention=True, q_lora_rank=None, kv_lora_rank=512, qk_head_dim=128,
               qk_pos_emb_head_dim=64, v_head_dim=128, qk_layernorm=True, normalization="RMSNorm",
               add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, init_seed=1)

if __name__ == "__main__":
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as store:   # a world of one rank: the layers ask for their groups
        torch.distributed.init_process_group("gloo", init_method=f"file://{store}/store", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        layer = MLASelfAttention(TransformerConfig(**V2_LITE), layer_number=1).eval()
        shapes = {}

        def record(name):
            def hook(module, inputs, out):   # the first call's output shape (a linear returns (out, bias))
                shapes.setdefault(name, tuple((out[0] if isinstance(out, tuple) else out).shape))
            return hook
        for name, module in layer.named_children():
            module.register_forward_hook(record(name))
        hidden = torch.randn(4, 1, 2048)                    # [s, b, h]
        with torch.no_grad():
            query, key, value = layer.get_query_key_value_tensors(hidden)
            layer(hidden)
        print(f"{'hidden_states':22} {tuple(hidden.shape)}")
        for name in ("linear_q_proj", "linear_kv_down_proj", "kv_layernorm", "linear_kv_up_proj"):
            print(f"{name:22} {shapes[name]}")
        for name, t in (("query", query), ("key", key), ("value", value)):
            print(f"{name:22} {tuple(t.shape)}")
        print(f"{'core_attention':22} {shapes['core_attention']}")
        print(f"{'linear_proj':22} {shapes['linear_proj']}")
        cfg = layer.config
        full = key.shape[-2] * key.shape[-1] + value.shape[-2] * value.shape[-1]   # every head's k and v
        latent = shapes["kv_layernorm"][-1] + cfg.qk_pos_emb_head_dim               # c_kv and the one k_pe
        print(f"KV cache per token and layer: keys and values {full} numbers, "
              f"MLA's latent + rope key {latent}, {full / latent:.1f}x fewer")
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()
