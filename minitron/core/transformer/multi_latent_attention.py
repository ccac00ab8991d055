"""Multi-latent attention (MLA, DeepSeek-V2): keys and values rebuilt from one small latent.

Ordinary attention keeps, for every past token, a key and a value per head: 2·n·d numbers
per token and layer in an inference KV cache. MLA instead projects the hidden state *down* to
one latent c_kv of kv_lora_rank channels, shared by all heads, and projects it back *up* to
each head's key and value. A cache only needs c_kv (plus one small rope key, below).

    hidden [s, b, h]
      -> linear_kv_down_proj   h -> kv_lora_rank + qk_pos_emb_head_dim     [c_kv | k_pe]
           c_kv -> kv_layernorm -> linear_kv_up_proj -> per head [k_nope | v]
                                   kv_lora_rank -> n·(qk_head_dim + v_head_dim)
           k_pe: one rope key of qk_pos_emb_head_dim channels, shared by every head
      -> queries: linear_q_proj h -> n·(qk_head_dim + qk_pos_emb_head_dim)      (q_lora_rank None)
              or linear_q_down_proj h -> q_lora_rank -> q_layernorm -> linear_q_up_proj
      -> q = [q_nope | rope(q_pe)], k = [k_nope | rope(k_pe)]: head size qk_head_dim + qk_pos_emb_head_dim
      -> core attention, softmax scale 1/sqrt(qk_head_dim + qk_pos_emb_head_dim)    [s, b, n·v_head_dim]
      -> linear_proj  (row-parallel) n·v_head_dim -> h

Why the rope part is "decoupled": rope rotates k by its position, and a rotation cannot be
folded into linear_kv_up_proj (which an inference kernel would like to absorb into the query),
so position rides on a few separate channels, k_pe, computed from the hidden state directly.

Tensor parallelism, as Megatron's local spec does it: every projection is column-parallel
except linear_proj. The up projections and linear_q_proj split by heads, as in SelfAttention.
The two down projections are small; their output columns are split too and all-gathered right
after, so every rank holds the whole latent (the layernorms need all its channels).
"""

from __future__ import annotations

import math

import torch

from minitron.core import parallel_state
from minitron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding, apply_rotary_pos_emb
from minitron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding, _yarn_get_mscale
from minitron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from minitron.core.tensor_parallel.mappings import (copy_to_tensor_model_parallel_region,
                                                    gather_from_tensor_model_parallel_region,
                                                    scatter_to_sequence_parallel_region)
from minitron.core.tensor_parallel.random import checkpoint as tensor_parallel_checkpoint
from minitron.core.tensor_parallel.utils import divide
from minitron.core.transformer.attention import DotProductAttention
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.torch_norm import WrappedTorchNorm
from minitron.trace import traced
from minitron.trace.recorder import short_value


def _column(config, in_size: int, out_size: int) -> ColumnParallelLinear:
    """Every MLA projection but linear_proj: column-parallel, no bias (Megatron's bias=False)."""
    return ColumnParallelLinear(in_size, out_size, config=config, init_method=config.init_method,
                                bias=False, gather_output=False)


def apply_mla_rope(t: torch.Tensor, freqs: torch.Tensor, rotary_interleaved: bool, mscale: float = 1.0) -> torch.Tensor:
    """Rope on MLA's position channels. DeepSeek's checkpoints pair channels (2i, 2i+1); Megatron
    first moves the even channels ahead of the odd ones, then rotates as it does elsewhere."""
    rot = freqs.shape[-1]
    t_rot, t_pass = t[..., :rot], t[..., rot:]
    t_rot = torch.cat((t_rot[..., 0::2], t_rot[..., 1::2]), dim=-1)
    return apply_rotary_pos_emb(torch.cat((t_rot, t_pass), dim=-1), freqs, rotary_interleaved, mscale)


class MLASelfAttention(MegatronModule):
    """Megatron-Core's MLASelfAttention with its local (non-Transformer-Engine) layer spec."""

    def __init__(self, config, layer_number: int):
        super().__init__(config)
        tp = parallel_state.get_tensor_model_parallel_world_size()
        n = config.num_attention_heads
        self.num_attention_heads_per_partition = divide(n, tp, "attention heads")
        self.q_head_dim = config.qk_head_dim + config.qk_pos_emb_head_dim
        # Megatron's order of registration (its Attention base builds these two first), which is
        # also the order of the state_dict and of the gradient buffer.
        self.core_attention = DotProductAttention(config, layer_number)
        # A head's q·k runs over qk_head_dim + qk_pos_emb_head_dim channels, not kv_channels. YaRN's
        # temperature for all channels (mscale_all_dim) is folded in here, squared as q·k would
        # square it; with rotary_scaling_factor <= 1 (or mscale_all_dim 0) it is 1. Megatron
        # computes this whatever the rope_type, so a rope-type rope MLA gets it too.
        mscale = _yarn_get_mscale(config.rotary_scaling_factor, config.mscale_all_dim)
        self.softmax_scale = mscale * mscale / math.sqrt(self.q_head_dim)
        self.core_attention.softmax_scale = self.softmax_scale
        self.checkpoint_core_attention = (config.recompute_granularity == "selective"
                                          and "core_attn" in (config.recompute_modules or ()))
        self.linear_proj = RowParallelLinear(
            n * config.v_head_dim, config.hidden_size, config=config, init_method=config.output_layer_init_method,
            bias=config.add_bias_linear, input_is_parallel=True, skip_bias_add=True)
        if config.q_lora_rank is None:
            self.linear_q_proj = _column(config, config.hidden_size, n * self.q_head_dim)
        else:
            self.linear_q_down_proj = _column(config, config.hidden_size, config.q_lora_rank)
            self.linear_q_up_proj = _column(config, config.q_lora_rank, n * self.q_head_dim)
        self.linear_kv_down_proj = _column(config, config.hidden_size,
                                           config.kv_lora_rank + config.qk_pos_emb_head_dim)
        self.linear_kv_up_proj = _column(config, config.kv_lora_rank, n * (config.qk_head_dim + config.v_head_dim))
        # The latents' norms exist only with --qk-layernorm (Megatron's spec puts an identity
        # there otherwise); DeepSeek-V2's configs turn it on.
        with_norms = config.qk_layernorm
        self.q_layernorm = (WrappedTorchNorm(config, config.q_lora_rank)
                            if with_norms and config.q_lora_rank is not None else None)
        self.kv_layernorm = WrappedTorchNorm(config, config.kv_lora_rank) if with_norms else None
        # MLA makes its own angles, for its qk_pos_emb_head_dim channels (GPTModel makes none).
        # Built with the default channel pairing and applied with the config's, as Megatron does.
        if config.rope_type == "rope":
            self.rotary_pos_emb = RotaryEmbedding(config.qk_pos_emb_head_dim, config.rotary_percent,
                                                  rotary_base=config.rotary_base)
        else:   # "yarn", MLA's default (DeepSeek-V2/V3 stretch 4k to 160k with s = 40)
            self.rotary_pos_emb = YarnRotaryEmbedding(
                config.qk_pos_emb_head_dim, rotary_base=config.rotary_base,
                scaling_factor=config.rotary_scaling_factor,
                original_max_position_embeddings=config.original_max_position_embeddings,
                beta_fast=config.beta_fast, beta_slow=config.beta_slow, mscale=config.mscale,
                mscale_all_dim=config.mscale_all_dim)

    def _whole_latent(self, out: torch.Tensor, size: int) -> torch.Tensor:
        """A down projection's column slices -> the whole latent on every rank."""
        if out.size(-1) != size:
            out = gather_from_tensor_model_parallel_region(out)
        return out

    def get_query_key_value_tensors(self, hidden_states):
        """[s, b, h] (or [s/tp, b, h] with sequence parallelism) -> q, k [s, b, n/p, qk+pe], v [s, b, n/p, v]."""
        cfg, n_p = self.config, self.num_attention_heads_per_partition
        sp = cfg.sequence_parallel and parallel_state.get_tensor_model_parallel_world_size() > 1
        if cfg.q_lora_rank is None:
            q, _ = self.linear_q_proj(hidden_states)
        else:
            q_compressed = self._whole_latent(self.linear_q_down_proj(hidden_states)[0], cfg.q_lora_rank)
            if sp:   # the column-parallel linear gathered the sequence; the norm works on my part
                q_compressed = scatter_to_sequence_parallel_region(q_compressed)
            if self.q_layernorm is not None:
                q_compressed = self.q_layernorm(q_compressed)
            q, _ = self.linear_q_up_proj(q_compressed)
        kv_combined = self._whole_latent(self.linear_kv_down_proj(hidden_states)[0],
                                         cfg.kv_lora_rank + cfg.qk_pos_emb_head_dim)
        kv_compressed, k_pos_emb = torch.split(kv_combined, [cfg.kv_lora_rank, cfg.qk_pos_emb_head_dim], dim=-1)
        # k_pe feeds only this rank's heads, so its gradient here is a partial sum over heads:
        # the all-reduce of this identity's backward completes it before the gather's backward
        # keeps this rank's columns (without it tp > 1 would train k_pe on a share of the heads).
        k_pos_emb = copy_to_tensor_model_parallel_region(k_pos_emb)
        if sp:
            kv_compressed = scatter_to_sequence_parallel_region(kv_compressed)
        if self.kv_layernorm is not None:
            kv_compressed = self.kv_layernorm(kv_compressed)
        kv, _ = self.linear_kv_up_proj(kv_compressed)

        s, b = q.shape[:2]                                        # the whole sequence again
        q = q.view(s, b, n_p, self.q_head_dim)
        kv = kv.view(s, b, n_p, cfg.qk_head_dim + cfg.v_head_dim)
        q_nope, q_pos_emb = torch.split(q, [cfg.qk_head_dim, cfg.qk_pos_emb_head_dim], dim=-1)
        k_nope, value = torch.split(kv, [cfg.qk_head_dim, cfg.v_head_dim], dim=-1)
        freqs, mscale = self.rotary_pos_emb(s), 1.0
        if cfg.rope_type == "yarn":
            freqs, mscale = freqs
        q_pos_emb = apply_mla_rope(q_pos_emb, freqs, cfg.rotary_interleaved, mscale)
        k_pos_emb = apply_mla_rope(k_pos_emb.unsqueeze(-2), freqs, cfg.rotary_interleaved, mscale)   # [s, b, 1, pe]
        query = torch.cat([q_nope, q_pos_emb], dim=-1)
        key = torch.cat([k_nope, k_pos_emb.expand(-1, -1, n_p, -1)], dim=-1)   # every head, the same k_pe
        return query.contiguous(), key.contiguous(), value.contiguous()

    @traced(args=lambda self, hidden_states, attention_mask=None, rotary_pos_emb=None: {
        "hidden_states": short_value(hidden_states)})
    def forward(self, hidden_states, attention_mask=None, rotary_pos_emb=None):
        """Same contract as SelfAttention.forward; ``rotary_pos_emb`` must be None (MLA makes its own)."""
        if rotary_pos_emb is not None:
            raise ValueError("MLA applies its own rope to its position channels: pass no rotary_pos_emb")
        query, key, value = self.get_query_key_value_tensors(hidden_states)
        if self.checkpoint_core_attention and self.training:
            context = tensor_parallel_checkpoint(self.core_attention, False, query, key, value, attention_mask)
        else:
            context = self.core_attention(query, key, value, attention_mask)
        return self.linear_proj(context)
