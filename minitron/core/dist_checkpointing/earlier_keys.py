"""torch_dist checkpoints of earlier minitron versions, read under today's keys.

Until issue 35, minitron stored an MoE layer in names of its own, not Megatron-Core's:

    today (Megatron-Core's)                               earlier minitron
    decoder.layers.mlp.experts.experts.linear_fc1.weight  decoder.layers.mlp.experts.local_experts.<e>.
      one (num_layers, E, ffn, h) tensor                    linear_fc1.weight: (num_layers, ffn, h) per e
    decoder.layers.self_attention.linear_qkv.layer_norm_  decoder.layers.input_layernorm.  (MoE layers)
    decoder.layers.mlp.linear_fc1.layer_norm_             decoder.layers.pre_mlp_layernorm.  (MoE layers)

and a multi-latent-attention layer's norms the other way round: Megatron's MLA spec keeps
``input_layernorm.`` and ``pre_mlp_layernorm.``, which earlier minitron renamed as a dense layer's.

Both hold the same numbers: expert e's piece of the stacked tensor is the earlier per-expert
tensor. So a piece the checkpoint lacks under its key is asked for under the earlier one, when
the checkpoint has that: no conversion step, and a checkpoint of today's keys is never touched.
The optimizer's moments (``optimizer.state.<moment>.<parameter's key>``) follow their parameter.
"""

from __future__ import annotations

import re
from dataclasses import replace

from minitron.core.dist_checkpointing.mapping import ShardedTensor, map_leaves

_EXPERTS = re.compile(r"\.mlp\.experts\.experts\.")
_NORMS = ((".self_attention.linear_qkv.layer_norm_", ".input_layernorm."),   # MoE layers
          (".mlp.linear_fc1.layer_norm_", ".pre_mlp_layernorm."),
          (".input_layernorm.", ".self_attention.linear_qkv.layer_norm_"),      # MLA layers
          (".pre_mlp_layernorm.", ".mlp.linear_fc1.layer_norm_"))


def earlier_form(sh: ShardedTensor) -> ShardedTensor | None:
    """The same piece as an earlier minitron keyed it, or None where the key did not change."""
    if _EXPERTS.search(sh.key):
        # The expert axis is the last one prepended (moe/experts.py: after the layer axis, if any);
        # earlier, the expert's index was in the key and the axis did not exist.
        axis = sh.prepend_axis_num - 1

        def drop(values):
            return None if values is None else (*values[:axis], *values[axis + 1:])
        key = _EXPERTS.sub(f".mlp.experts.local_experts.{sh.global_offset[axis]}.", sh.key, count=1)
        return replace(sh, key=key, global_shape=drop(sh.global_shape), global_offset=drop(sh.global_offset),
                       axis_fragmentations=drop(sh.axis_fragmentations), prepend_axis_num=axis)
    for today, earlier in _NORMS:
        if today in sh.key:
            return replace(sh, key=sh.key.replace(today, earlier, 1))
    return None


def read_earlier_keys(built, saved_keys) -> object:
    """``built`` (factories applied) with each piece whose key ``saved_keys`` lacks, and whose
    earlier key it has, asked for under that earlier key instead."""
    def pick(x):
        if not isinstance(x, ShardedTensor) or x.key in saved_keys:
            return x
        earlier = earlier_form(x)
        return earlier if earlier is not None and earlier.key in saved_keys else x
    return map_leaves(pick, built)
