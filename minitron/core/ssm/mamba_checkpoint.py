"""A hybrid model's torch_dist checkpoint keys: Megatron-Core 0.19.2's, and reshardable.

Two things make a Mamba layer unlike the layers transformer/utils.py keys:

* Its fused weights are stacks of sections, each cut by tensor parallelism on its own (mamba_mixer.py):
  rank r holds [z_r | x_r | B_r | C_r | dt_r] of in_proj and [x_r | B_r | C_r] of the conv.
  A plain "rank r holds rows r·n/t .. (r+1)·n/t" description would store the ranks' blocks
  one after another, a layout that another tensor-parallel size would misread. So each section
  is saved under a key of its own, as Megatron saves them (``in_proj.weight.z`` ... ``.dt``,
  ``conv1d.weight.x`` / ``.B`` / ``.C``), each an ordinary tensor-parallel split: any tp reads it.
* The layers differ, so each keeps its global index (``decoder.layers.<i>.``), as Megatron's
  HybridStack keys them, and its norms take the names of the Transformer Engine layers that
  Megatron's hybrid spec fuses them into (the Mamba layer's into in_proj).
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state
from minitron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
from minitron.core.transformer.utils import (
    make_sharded_tensors_for_checkpoint, replace_prefix_for_sharding, sharded_state_dict_default)

# Megatron's hybrid spec: which norm is fused into which TE linear, per layer symbol ('E' keeps its own).
FUSED_NORM_KEYS = {"M": ("norm.", "mixer.in_proj.layer_norm_"),
                   "*": ("input_layernorm.", "self_attention.linear_qkv.layer_norm_"),
                   "-": ("pre_mlp_layernorm.", "mlp.linear_fc1.layer_norm_")}


def sections_factory(key: str, tensor: torch.Tensor, sections: list[int], names: list[str], prepend: tuple,
                     replica_id) -> ShardedTensorFactory:
    """``tensor``: this rank's share of each of ``sections`` (serial sizes), stacked along dim 0;
    saved as one key per section, ``key.<name>``."""
    rank = parallel_state.get_tensor_model_parallel_rank()
    tp = parallel_state.get_tensor_model_parallel_world_size()
    local = [size // tp for size in sections]

    def build(key, data, replica_id):
        return [ShardedTensor.from_rank_offsets(f"{key}.{name}", piece, *prepend, (len(prepend), rank, tp),
                                                replica_id=replica_id, prepend_axis_num=len(prepend))
                for name, piece in zip(names, torch.split(data.detach(), local, dim=0))]

    def merge(pieces):
        return torch.cat(pieces, dim=0)
    return ShardedTensorFactory(key, tensor, build, merge, replica_id)


def mixer_sharded_state_dict(mixer, prefix: str, sharded_offsets: tuple = (), metadata=None) -> dict:
    own = {}
    mixer._save_to_state_dict(own, "", keep_vars=True)
    conv = {name: own.pop(name) for name in ("conv1d_weight", "conv1d_bias")}
    out = make_sharded_tensors_for_checkpoint(own, prefix, sharded_offsets)   # dt_bias, A_log, D: per head
    dp = parallel_state.get_data_parallel_rank(with_context_parallel=True)
    gn = mixer.ngroups * mixer.d_state
    for name, tensor in conv.items():
        key = f"{prefix}{name.replace('conv1d_', 'conv1d.')}"
        out[f"{prefix}{name}"] = sections_factory(key, tensor, [mixer.d_inner, gn, gn], ["x", "B", "C"],
                                                  sharded_offsets, (0, 0, dp))
    for name, child in mixer.named_children():
        out.update(sharded_state_dict_default(child, f"{prefix}{name}.", sharded_offsets, metadata))
    out[f"{prefix}in_proj.weight"] = sections_factory(
        f"{prefix}in_proj.weight", mixer.in_proj.weight, [mixer.d_inner, mixer.d_inner, gn, gn, mixer.nheads],
        ["z", "x", "B", "C", "dt"], sharded_offsets, (0, 0, dp))
    return out


def hybrid_stack_sharded_state_dict(stack, prefix: str = "", sharded_offsets: tuple = (), metadata=None) -> dict:
    """Each layer under its global index, its fused norm under Megatron's TE name; the final norm."""
    out = {}
    for i, (symbol, layer) in enumerate(zip(stack.layer_type_list, stack.layers)):
        local, key = f"{prefix}layers.{i}.", f"{prefix}layers.{layer.layer_number - 1}."
        layer_dict = sharded_state_dict_default(layer, local, sharded_offsets, metadata)
        replace_prefix_for_sharding(layer_dict, local, key)
        if symbol in FUSED_NORM_KEYS:
            old, new = FUSED_NORM_KEYS[symbol]
            replace_prefix_for_sharding(layer_dict, key + old, key + new)
        out.update(layer_dict)
    if stack.final_norm is not None:
        out.update(sharded_state_dict_default(stack.final_norm, f"{prefix}final_norm.", sharded_offsets, metadata))
    return out
