"""Self-attention, split across the tensor-parallel ranks by heads.

Heads are independent of one another until the output projection mixes them, so the natural
cut is: rank i of p computes heads [i*n/p, (i+1)*n/p) from start to finish.

    hidden [s, b, h]
      -> linear_qkv   ColumnParallelLinear h -> 3h   (this rank's heads' q, k, v)  [s, b, 3h/p]
      -> core_attention  softmax(q k^T / sqrt(d) + causal mask) v                  [s, b, h/p]
      -> linear_proj  RowParallelLinear h -> h       (partial sums, all-reduced)   [s, b, h]

The qkv weight's output rows are ordered head by head, [q_0 k_0 v_0 | q_1 k_1 v_1 | ...],
not [all q | all k | all v]. That order is what makes a plain contiguous column split hand each
rank complete heads with their own q, k and v. (With grouped-query attention the unit is a
group of heads sharing one k and v, [q.. k v] per group; see SelfAttention.)
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from minitron.core import parallel_state
from minitron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from minitron.core.tensor_parallel.mappings import all_gather_last_dim_from_tensor_parallel_region
from minitron.core.models.common.embeddings.rotary_pos_embedding import apply_rotary_pos_emb
from minitron.core.models.common.embeddings.yarn_rotary_pos_embedding import _yarn_get_concentration_factor_from_config
from minitron.core.tensor_parallel.random import checkpoint as tensor_parallel_checkpoint
from minitron.core.tensor_parallel.random import get_cuda_rng_tracker
from minitron.core.tensor_parallel.utils import divide
from minitron.core.tensor_parallel.weight_init import (init_device, initialize_affine_weight,
                                                       set_tensor_model_parallel_attributes)
from minitron.core.transformer.context_parallel import attn_forward_func_with_cp
from minitron.core.transformer.context_parallel_a2a import (attn_forward_func_with_cp_a2a,
                                                            attn_forward_func_with_cp_a2a_p2p)
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.qk_layer_scaling import attention_scores, uses_qk_layer_scaling
from minitron.core.transformer.torch_norm import L2Norm, WrappedTorchNorm
from minitron.core.transformer.utils import get_sliding_window_causal_mask, is_layer_window_attention
from minitron.trace import traced
from minitron.trace.recorder import short_value


def is_causal_mask(attention_mask: torch.Tensor) -> bool:
    """True if the mask ([b or 1, 1, s, s], True = hidden) hides exactly each query's future."""
    s = attention_mask.size(-1)
    if attention_mask.dim() != 4 or attention_mask.size(-2) != s:
        return False
    causal = torch.ones(s, s, dtype=torch.bool, device=attention_mask.device).triu_(1)
    return torch.equal(attention_mask, causal.expand_as(attention_mask))


class DotProductAttention(MegatronModule):
    """softmax(q k^T / sqrt(d), causal) v for this rank's heads. Inputs [s, b, heads, d].

    With context parallelism ``s`` is this rank's two chunks of the sequence, and the keys of
    the other chunks come round the context-parallel ring (context_parallel.py)."""

    def __init__(self, config, layer_number: int):
        super().__init__(config)
        self.layer_number = layer_number
        self.softmax_scale = 1.0 / math.sqrt(config.kv_channels)
        self.attention_dropout = torch.nn.Dropout(config.attention_dropout)
        # Sliding-window attention (--window-size): this layer's window, or None for full.
        self.window_size = (config.window_size if is_layer_window_attention(
            config.window_size, config.window_attn_skip_freq, layer_number) else None)
        # --cp-comm-type: one kind for every layer, or one per layer (Megatron's list form).
        comm = config.cp_comm_type
        self.cp_comm_type = comm[layer_number - 1] if isinstance(comm, (list, tuple)) else comm
        self.softmax_offset = self._attention_sink(config)

    @staticmethod
    def _attention_sink(config):
        """--softmax-type: a "sink" logit per head that joins every row of the softmax and is
        then dropped, so a head may give less than all of its attention to the real keys
        (Miller's "attention is off by one"; gpt-oss learns one per head). vanilla: none;
        off-by-one: a fixed 0, e^0 = 1 added to each denominator; learnable: a parameter.
        Heads are split over tensor-parallel ranks, and so is it: each rank holds its heads'."""
        heads = divide(config.num_attention_heads, parallel_state.get_tensor_model_parallel_world_size(),
                       "attention heads")
        if config.softmax_type == "vanilla":
            return None
        if config.softmax_type == "off-by-one":   # a constant, as in Megatron: no parameter, not saved
            return torch.zeros(heads, dtype=config.params_dtype, device=init_device())
        if config.softmax_type != "learnable":
            raise ValueError(f"softmax_type {config.softmax_type!r}: vanilla, off-by-one or learnable")
        sink = torch.nn.Parameter(torch.empty(heads, dtype=config.params_dtype, device=init_device()))
        # Drawn as a column [n, 1] of which this rank keeps its rows: the serial model's values.
        initialize_affine_weight(sink.data.view(heads, 1), config, config.num_attention_heads, 1, heads, 0,
                                 config.init_method)
        set_tensor_model_parallel_attributes(sink, True, 0)
        return sink

    @traced(args=lambda self, query, key, value, attention_mask=None: {"query": short_value(query)})
    def forward(self, query, key, value, attention_mask=None):
        # [s, b, n, d] -> [b, n, s, d]: batch and heads in front, as the matmuls want.
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        if self.window_size is not None:
            # The window hides keys too far back (and ahead); what the data's mask hides stays
            # hidden. An explicit mask sends both paths below through it.
            window = get_sliding_window_causal_mask(q.size(2), k.size(2), self.window_size, device=q.device)
            attention_mask = window if attention_mask is None else attention_mask | window
        if k.size(1) != q.size(1):
            # Grouped-query attention: each key/value head serves n_q / n_kv query heads (the
            # one place the copies are made, as in Megatron's core attention).
            k, v = (t.repeat_interleave(q.size(1) // t.size(1), dim=1) for t in (k, v))
        if parallel_state.get_context_parallel_world_size() > 1:
            context = self._context_parallel(q, k, v)
        else:
            context = self._attention(q, k, v, attention_mask)
        b, n, s, d = context.shape
        return context.permute(2, 0, 1, 3).reshape(s, b, n * d)  # [s, b, h/p]

    def _attention(self, q, k, v, attention_mask):
        """The whole sequence's attention for these heads, [b, n, s, d]; None mask: causal."""
        if (self.training and self.attention_dropout.p > 0) or self.softmax_offset is not None or \
                uses_qk_layer_scaling(self.config):   # Megatron's local attention scales its stored scores
            return self._unfused(q, k, v, attention_mask)
        # torch's fused kernel, where it gives the same numbers: without dropout it matches
        # the unfused path to fp32 rounding (a few 1e-7: it sums in another order; the test
        # test_fused_attention_gives_the_unfused_numbers holds it under 1e-6). With dropout
        # the kernel draws its own mask, not nn.Dropout's, so we take the unfused path.
        # Megatron's mask says True = "hide"; torch's boolean attn_mask says True = "attend".
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if attention_mask is None else ~attention_mask,
            is_causal=attention_mask is None, scale=self.softmax_scale)

    def _context_parallel(self, q, k, v):
        """This rank holds two chunks of the sequence. p2p: the others' keys come round the
        ring; a2a: an all-to-all trades the sequence split for a head split, and the unsplit
        attention runs on whole sequences of n/cp heads (context_parallel_a2a.py).

        The mask is not consulted: both know where each chunk sits in the sequence and hide the
        future accordingly. validate_args refuses the one dataloader mask that is not plain
        causal, --reset-attention-mask, when context parallelism is on.
        """
        if self.softmax_offset is not None:
            raise ValueError("attention sinks (softmax_type) with context parallelism: the ring has no sink column")
        if self.cp_comm_type == "a2a":
            return attn_forward_func_with_cp_a2a(q, k, v, lambda q, k, v: self._attention(q, k, v, None))
        dropout_p = self.attention_dropout.p if self.training else 0.0
        # The same RNG stream the unsplit attention draws its dropout from (see _unfused).
        fork = contextlib.nullcontext if self.config.sequence_parallel else get_cuda_rng_tracker().fork

        def ring(q, k, v, group=None):
            return attn_forward_func_with_cp(q, k, v, self.softmax_scale, dropout_p, fork_rng=fork, cp_group=group)
        if self.cp_comm_type == "a2a+p2p":   # all-to-all inside sub-groups, the ring across them
            return attn_forward_func_with_cp_a2a_p2p(q, k, v, ring)
        return ring(q, k, v)

    def _unfused(self, q, k, v, attention_mask):
        scores = attention_scores(q, k, self.softmax_scale, self.config, self.layer_number)  # [b, n, s, s]
        if attention_mask is None:
            s = scores.size(-1)
            attention_mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=scores.device), 1)
        # Megatron fills -10000 rather than -inf: exp underflows to exactly 0 all the same,
        # and a fully hidden row gives a uniform row instead of NaN.
        scores = scores.masked_fill(attention_mask, -10000.0)
        if self.softmax_offset is not None:   # the sink: one more column in every row, then dropped
            b, n, s, _ = scores.shape
            sink = self.softmax_offset.to(scores.dtype).view(1, n, 1, 1).expand(b, n, s, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1).float(), dim=-1)[..., :-1].type_as(q)
        else:
            probs = torch.softmax(scores.float(), dim=-1).type_as(q)
        if self.config.sequence_parallel:
            # The whole transformer block already runs on the model-parallel stream.
            probs = self.attention_dropout(probs)
        else:
            # These are this rank's heads only: their masks must differ from the other ranks'.
            with get_cuda_rng_tracker().fork():
                probs = self.attention_dropout(probs)
        return torch.matmul(probs, v)


class SelfAttention(MegatronModule):
    """linear_qkv (column-parallel) -> core attention on my heads -> linear_proj (row-parallel).

    Grouped-query attention (``num_query_groups`` g < heads n): the heads fall into g groups of
    n/g query heads that share one key and one value head, so linear_qkv makes n query heads
    but only g key and g value heads. Its output is laid out group by group,
    [q_1 .. q_{n/g} k v] per group (Megatron's order), and the column split hands each TP rank
    g/p whole groups: its query heads arrive with the one key and value they read. With g = n
    this is ordinary multi-head attention, [q k v] per head.

    With fewer groups than ranks (g < p, p a multiple of g) p/g ranks share each group, and the
    plain column split cuts a group's [q.. k v] in pieces, only one of which holds k and v.
    Megatron keeps that split (and so the weights' layout) and repairs it after the matmul:
    every rank all-gathers the whole output, keeps its group's [q.. k v], and of the group's
    query heads its own n/p. Key and value are then computed on all p/g ranks of the group; the
    all-gather's backward sums their gradients (``_my_group_of_qkv``).
    """

    def __init__(self, config, layer_number: int):
        super().__init__(config)
        tp = parallel_state.get_tensor_model_parallel_world_size()
        self.num_attention_heads_per_partition = divide(config.num_attention_heads, tp, "attention heads")
        # g < p: p/g ranks share one group (see the class docstring); else each has g/p groups.
        self.ranks_per_query_group = tp // config.num_query_groups if config.num_query_groups < tp else 1
        self.num_query_groups_per_partition = (1 if self.ranks_per_query_group > 1
                                               else divide(config.num_query_groups, tp, "query groups"))
        self.hidden_size_per_attention_head = config.kv_channels
        query_projection_size = config.kv_channels * config.num_attention_heads
        kv_projection_size = config.kv_channels * config.num_query_groups
        self.linear_qkv = ColumnParallelLinear(
            config.hidden_size, query_projection_size + 2 * kv_projection_size, config=config,
            init_method=config.init_method, bias=config.add_bias_linear or config.add_qkv_bias,
            gather_output=False)   # --add-qkv-bias: this bias even without the others (Qwen 2.5)
        self.core_attention = DotProductAttention(config, layer_number)
        # Selective recomputation (Megatron's checkpoint_core_attention): the s x s scores,
        # probabilities and dropout mask are most of a layer's activations at long sequences
        # and the cheapest to recompute (no weights, a few matmuls), so drop just those.
        self.checkpoint_core_attention = (config.recompute_granularity == "selective"
                                          and "core_attn" in (config.recompute_modules or ()))
        self.linear_proj = RowParallelLinear(
            query_projection_size, config.hidden_size, config=config,
            init_method=config.output_layer_init_method, bias=config.add_bias_linear,
            input_is_parallel=True, skip_bias_add=True)
        # --qk-layernorm: one norm over each head's d channels, shared by all heads (and so by
        # all TP ranks, each of which feeds it only its own heads: finalize_model_grads sums
        # its gradient over the TP group, as Megatron's does by these two names).
        self.q_layernorm = WrappedTorchNorm(config, config.kv_channels) if config.qk_layernorm else None
        self.k_layernorm = WrappedTorchNorm(config, config.kv_channels) if config.qk_layernorm else None
        if config.qk_l2_norm:   # Llama 4: the same place, no weight (Megatron's spec prefers it)
            self.q_layernorm = L2Norm(config.kv_channels, config.layernorm_epsilon)
            self.k_layernorm = L2Norm(config.kv_channels, config.layernorm_epsilon)
        # --no-rope-freq (Llama 4's NoPE layers): this layer takes no rope, however the model rotates.
        freq, n = config.no_rope_freq, layer_number
        self.no_rope = bool(freq) and (n % freq == 0 if isinstance(freq, int) else bool(freq[n - 1]))
        # --position-embedding-type yarn: YaRN's concentration factor on cos and sin (1.0 otherwise).
        self._yarn_concentration_factor = _yarn_get_concentration_factor_from_config(config)

    def get_query_key_value_tensors(self, hidden_states):
        """[s, b, h] -> query [s, b, n/p, d], key and value [s, b, g/p, d]."""
        mixed_qkv, _ = self.linear_qkv(hidden_states)            # [s, b, g/p * (n/g + 2) * d]
        if self.ranks_per_query_group > 1:
            mixed_qkv = self._my_group_of_qkv(mixed_qkv)         # [s, b, (n/g + 2) * d]
        s, b = mixed_qkv.shape[:2]
        d = self.hidden_size_per_attention_head
        heads_per_group = self.config.num_attention_heads // self.config.num_query_groups
        mixed_qkv = mixed_qkv.view(s, b, self.num_query_groups_per_partition, (heads_per_group + 2) * d)
        query, key, value = torch.split(mixed_qkv, [heads_per_group * d, d, d], dim=-1)
        query = query.reshape(s, b, self.num_query_groups_per_partition * heads_per_group, d)
        if self.ranks_per_query_group > 1:                       # my n/p of the group's n/g queries
            mine = parallel_state.get_tensor_model_parallel_rank() % self.ranks_per_query_group
            n_p = self.num_attention_heads_per_partition
            query = query[:, :, mine * n_p:(mine + 1) * n_p]
        if self.q_layernorm is not None:      # before rope, as in Megatron
            query, key = self.q_layernorm(query), self.k_layernorm(key)
        return query, key, value

    def _my_group_of_qkv(self, mixed_qkv):
        """g < p: the whole [s, b, g * (n/g + 2) * d] from every rank's piece, cut to my group's."""
        whole = all_gather_last_dim_from_tensor_parallel_region(mixed_qkv)
        group = parallel_state.get_tensor_model_parallel_rank() // self.ranks_per_query_group
        size = whole.size(-1) // self.config.num_query_groups
        return whole[..., group * size:(group + 1) * size]

    @traced(args=lambda self, hidden_states, attention_mask=None, rotary_pos_emb=None: {
        "hidden_states": short_value(hidden_states)})
    def forward(self, hidden_states, attention_mask=None, rotary_pos_emb=None):
        """[s, b, h] (or [s/p, b, h] with sequence parallelism) -> (output, bias) of the same shape."""
        query, key, value = self.get_query_key_value_tensors(hidden_states)
        if rotary_pos_emb is not None and not self.no_rope:      # --position-embedding-type rope / yarn
            mscale = self._yarn_concentration_factor
            query = apply_rotary_pos_emb(query, rotary_pos_emb, self.config.rotary_interleaved, mscale)
            key = apply_rotary_pos_emb(key, rotary_pos_emb, self.config.rotary_interleaved, mscale)
        # key and value keep their g/p heads here: DotProductAttention repeats them for the
        # query heads of their group (inside the recomputed region, so the copies are not kept).
        if self.checkpoint_core_attention and self.training:
            context = tensor_parallel_checkpoint(self.core_attention, False, query, key, value, attention_mask)
        else:
            context = self.core_attention(query, key, value, attention_mask)
        return self.linear_proj(context)
