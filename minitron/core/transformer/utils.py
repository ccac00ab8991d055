"""Helpers of the transformer layers, as Megatron-Core keeps them in transformer/utils.py: the
sharded state dicts of checkpoints, and the masks of sliding-window attention.

Sharded state dicts: each parameter described by its place in the global tensor.

A parallel layer already knows how its weight is cut: set_tensor_model_parallel_attributes
marks it (``tensor_model_parallel``, ``partition_dim``, ``partition_stride``), and experts
carry ``allreduce = False``. So one default reads those marks for every module, and only the
places whose *numbering* depends on the layout override it: the layer stack (global layer
index), the tied output layer, the experts (an axis of all experts: moe/experts.py).

Who writes what (replica ids, all zeros = the writer):
    tensor-parallel slice   (0, 0, dp rank)          each slice once, by data-parallel rank 0
    replicated over TP      (0, tp rank, dp rank)    a layernorm: tp rank 0 of dp rank 0
    expert                  (0, 0, expert-dp rank)   its expert-data-parallel replicas skip
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state
from minitron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
from minitron.core.layer_patterns import moe_layer_pattern


def _ranks(tensor) -> tuple[int, int, int, int]:
    """(tp rank, tp size, dp rank, which dp group) for this tensor: experts use the expert groups."""
    expert = not getattr(tensor, "allreduce", True)
    if expert:
        tp_group = parallel_state.get_expert_tensor_parallel_group()
        return (torch.distributed.get_rank(tp_group), torch.distributed.get_world_size(tp_group),
                torch.distributed.get_rank(parallel_state.get_expert_data_parallel_group()))
    return (parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_data_parallel_rank(with_context_parallel=True))


def _swiglu_factory(key: str, tensor, axis: int, tp_rank: int, tp_size: int, prepend: tuple,
                    replica_id) -> ShardedTensorFactory:
    """SwiGLU's fc1 holds [gate_r | up_r] (mlp.py): in the global [gate | up] matrix these are
    pieces r and p + r of 2p, not one contiguous block. Two chunks of one key, then: any other
    tp size cuts the same global matrix its own way."""
    n_prepend = len(prepend)

    def build(key, data, replica_id):
        gate, up = torch.chunk(data.detach(), 2, dim=axis)
        return [ShardedTensor.from_rank_offsets(key, half, *prepend, (axis + n_prepend, r, 2 * tp_size),
                                                replica_id=replica_id, prepend_axis_num=n_prepend)
                for half, r in ((gate, tp_rank), (up, tp_size + tp_rank))]

    def merge(halves):
        return torch.cat(halves, dim=axis)
    return ShardedTensorFactory(key, tensor, build, merge, replica_id)


def make_sharded_tensors_for_checkpoint(state_dict: dict, prefix: str, sharded_offsets: tuple = ()) -> dict:
    """Wrap each tensor of a (non-recursive) state dict by the cut its attributes describe."""
    out = {}
    for name, tensor in state_dict.items():
        if tensor is None:
            continue
        key = f"{prefix}{name}"
        tp_rank, tp_size, dp_rank = _ranks(tensor)
        data = tensor.detach()
        n_prepend = len(sharded_offsets)
        embedding = getattr(tensor, "is_embedding_or_output_parameter", False)
        if getattr(tensor, "tensor_model_parallel", False):
            axis, replica = tensor.partition_dim, (0, 0, dp_rank)
            if getattr(tensor, "partition_stride", 1) > 1:
                out[key] = _swiglu_factory(key, tensor, axis, tp_rank, tp_size, sharded_offsets, replica)
                continue
            out[key] = ShardedTensor.from_rank_offsets(
                key, data, *sharded_offsets, (axis + n_prepend, tp_rank, tp_size), replica_id=replica,
                prepend_axis_num=n_prepend, allow_shape_mismatch=embedding)
        else:
            out[key] = ShardedTensor.from_rank_offsets(
                key, data, *sharded_offsets, replica_id=(0, tp_rank, dp_rank), prepend_axis_num=n_prepend,
                allow_shape_mismatch=embedding)
    return out


def sharded_state_dict_default(module: torch.nn.Module, prefix: str = "", sharded_offsets: tuple = (),
                               metadata: dict | None = None) -> dict:
    """A module's own sharded_state_dict if it has one, else its tensors by their attributes."""
    if hasattr(module, "sharded_state_dict"):
        return module.sharded_state_dict(prefix, sharded_offsets, metadata)
    out = {}
    own = {}
    module._save_to_state_dict(own, "", keep_vars=True)   # its own params and persistent buffers
    out.update(make_sharded_tensors_for_checkpoint(own, prefix, sharded_offsets))
    for name, child in module.named_children():
        out.update(sharded_state_dict_default(child, f"{prefix}{name}.", sharded_offsets, metadata))
    return out


def module_sharded_state_dict(module, prefix: str = "", sharded_offsets: tuple = (), metadata=None) -> dict:
    """MegatronModule's default: its own tensors, then each child's (default or override)."""
    own = {}
    module._save_to_state_dict(own, "", keep_vars=True)
    out = make_sharded_tensors_for_checkpoint(own, prefix, sharded_offsets)
    for name, child in module.named_children():
        out.update(sharded_state_dict_default(child, f"{prefix}{name}.", sharded_offsets, metadata))
    return out


# Megatron's local layer spec (gpt_layer_specs.py, sharded_state_dict_keys_map) stores a layer's
# norms under the names Transformer Engine's fused norm+linear layers give them, so that a dense
# checkpoint reads the same with either spec. minitron keeps those names, and with them Megatron's
# checkpoints and its own stay interchangeable. (The local spec renames an MoE layer's norms too;
# Megatron's TE spec keeps ``pre_mlp_layernorm.`` there, so its MoE checkpoints differ by that name.
# Its MLA spec has no such map: a multi-latent-attention layer keeps both names.)
LOCAL_SPEC_KEYS_MAP = {"input_layernorm.": "self_attention.linear_qkv.layer_norm_",
                       "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}


def block_sharded_state_dict(block, prefix: str = "", sharded_offsets: tuple = (), metadata=None) -> dict:
    """TransformerBlock: layer i of this stage is global layer ``layer_number - 1``, so its
    tensors become slices of one (num_layers, ...) tensor per name, keyed without the index:
    the same key and place at any pipeline or virtual-pipeline size (Megatron's layout for a
    stack of identical layers; layers that differ are keyed by their global index instead)."""
    out = {}
    num_layers = block.config.num_layers
    # MoE every f-th layer (f > 1): the layers differ, so each keeps its own keys
    # (decoder.layers.<global index>.*), as Megatron's non_homogeneous_layers does.
    homogeneous = block.config.num_moe_experts is None or all(
        moe_layer_pattern(block.config.moe_layer_freq, num_layers))
    for i, layer in enumerate(block.layers):
        offsets, key = sharded_offsets, f"{prefix}layers.{layer.layer_number - 1}."
        if homogeneous:
            offsets, key = (*sharded_offsets, (len(sharded_offsets), layer.layer_number - 1, num_layers)), \
                f"{prefix}layers."
        # The dict keeps the module's own path (layers.<i>., as state_dict); the checkpoint key is global.
        layer_dict = sharded_state_dict_default(layer, f"{prefix}layers.{i}.", offsets, metadata)
        replace_prefix_for_sharding(layer_dict, f"{prefix}layers.{i}.", key)
        # Dense and MoE layers alike: Megatron's local spec applies its map to both (its TE spec
        # keeps an MoE layer's ``pre_mlp_layernorm.``, a separate norm there); MLA layers, none.
        if not block.config.multi_latent_attention:
            for old, new in LOCAL_SPEC_KEYS_MAP.items():
                replace_prefix_for_sharding(layer_dict, key + old, key + new)
        out.update(layer_dict)
    for name, child in block.named_children():
        if child is not block.layers:
            out.update(sharded_state_dict_default(child, f"{prefix}{name}.", sharded_offsets, metadata))
    return out


def replace_prefix_for_sharding(sharded: dict, old: str, new: str) -> dict:
    """Rename the checkpoint keys (not the dict's keys) that start with ``old``."""
    for sh in sharded.values():
        if sh.key.startswith(old):
            sh.key = new + sh.key[len(old):]
    return sharded


def tie_output_layer(sharded: dict, model, prefix: str = "") -> dict:
    """A tied output layer on a stage without the embedding holds a *copy* of the embedding
    (language_module.py): read it from the embedding's key, and never write it (not the main
    replica)."""
    key = f"{prefix}output_layer.weight"
    if model.share_embeddings_and_output_weights and not model.pre_process and key in sharded:
        sh = sharded.pop(key)
        sh.key = f"{prefix}embedding.word_embeddings.weight"
        sh.replica_id = (1, *sh.replica_id[1:])
        sharded[key] = sh
    return sharded

# --- sliding-window attention (--window-size, --window-attn-skip-freq) ------------------------
# Megatron-Core keeps both helpers in megatron/core/transformer/utils.py, under these names.
# A window of (left, right) lets query i see keys i - left .. i + right. A GPT trains with
# (left, 0): the causal mask, cut off ``left`` tokens back. Layers alternate between windowed
# and full attention by ``window_attn_skip_freq`` (gpt-oss: every other layer is full), so the
# model keeps some layers that see the whole context while most pay for a band of it only.


def is_layer_window_attention(window_size, window_attn_skip_freq, layer_number: int) -> bool:
    """Does layer ``layer_number`` (1-based, as Megatron numbers layers) use the window?

    ``window_attn_skip_freq`` N: every N-th layer (N, 2N, ...) attends to everything, the rest
    through the window; a list gives each layer's choice (1 = window); None: every layer."""
    if not window_size:
        return False
    if window_attn_skip_freq is None:
        return True
    if isinstance(window_attn_skip_freq, int):
        return layer_number % window_attn_skip_freq != 0
    return bool(window_attn_skip_freq[layer_number - 1])


def get_sliding_window_causal_mask(sq: int, skv: int, window_size, device=None) -> torch.Tensor:
    """[sq, skv] boolean mask, True = hidden, for a window of (left, right) tokens around each
    query (the last query aligned with the last key). -1 on a side means no limit that side."""
    left, right = window_size
    visible = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if left >= 0:
        visible = visible.triu(skv - sq - left)
    if right >= 0:
        visible = visible.tril(skv - sq + right)
    return ~visible
