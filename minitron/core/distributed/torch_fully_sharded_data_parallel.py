"""TorchFullyShardedDataParallel: --use-torch-fsdp2, a model chunk sharded by torch's own FSDP2.

Megatron-FSDP (fsdp/) is Megatron's own sharding; this wrapper hands the same job to torch's
``fully_shard`` (torch.distributed.fsdp), as Megatron-Core's class of this name does. Each
transformer layer and the embedding become an FSDP *unit*, and the chunk itself the root unit
(the final norm and the output layer). fully_shard replaces every parameter by a DTensor that
holds this rank's rows of it (Shard(0): rows cut into dp chunks, the last ones padded), and
hooks the modules so that

    before a unit's forward      all-gather its parameters (torch.distributed.all_gather_single)
    after it                     free them again (--torch-fsdp2-no-reshard-after-forward keeps them)
    before its backward          all-gather them again (the next unit's is fetched ahead)
    after its backward           reduce-scatter its gradients (reduce_scatter_single), averaged
                                 over dp, into ``param.grad``: a DTensor of this rank's rows

The root unit is gathered once per micro-batch and freed only when its gradients are reduced,
torch's rule for the root (its parameters are the first that backward needs).

So the gradients are reduced during backward, every micro-batch, and this class answers the
schedule and finalize_model_grads (no_sync, finish_grad_sync, ...) with little to do. The
optimizer is the ordinary one over the DTensor parameters: torch's AdamW steps each rank's rows,
and the gradient norm sums the local rows' squares over dp (clip_grads.get_grad_norm_fp32).
Imported only under --use-torch-fsdp2: loading torch.distributed.tensor costs seconds here.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state
from minitron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory, map_leaves
from minitron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from minitron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.transformer_layer import TransformerLayer

# Megatron's default units (TransformerLayer, the embeddings); its ColumnParallelLinear (the
# output layer) is left out for the local layers, as Megatron leaves it out for transformer_impl
# "local", so the output layer belongs to the root unit.
SUB_MODULES_TO_WRAP = (TransformerLayer, LanguageModelEmbedding, RotaryEmbedding)


class TorchFullyShardedDataParallel(MegatronModule):
    """Wrap ``module`` (one model chunk) with torch's fully_shard over the data-parallel group."""

    def __init__(self, config, module: torch.nn.Module, reshard_after_forward: bool = True,
                 broadcast_from_src: bool = False):
        super().__init__(config)
        self.module = module
        self.process_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        if broadcast_from_src:   # --data-parallel-random-init: rank 0's draw becomes everyone's, before the cut
            src = parallel_state.get_data_parallel_src_rank(with_context_parallel=True)
            for p in module.parameters():
                torch.distributed.broadcast(p.data, src=src, group=self.process_group)
        # A one-dimensional mesh over the existing group: FSDP2 then reduces and gathers on that
        # group (gloo on CPU ranks, nccl on GPUs), and the trace names it DATA_PARALLEL_GROUP_WITH_CP.
        device_type = torch.device(get_accelerator().current_device_name()).type
        self.device_mesh = DeviceMesh.from_group(self.process_group, device_type)
        # fully_shard makes new Parameters (DTensors) and drops the attributes the layers set on
        # theirs (tensor_model_parallel, sequence_parallel, ...), which the gradient norm and
        # finalize_model_grads read: keep them and put them back (Megatron does the same).
        attrs = {name: dict(vars(p)) for name, p in module.named_parameters()}
        self.unit_names = []
        for name, sub in module.named_modules():
            if isinstance(sub, SUB_MODULES_TO_WRAP) and any(True for _ in sub.parameters()):
                fully_shard(sub, mesh=self.device_mesh, reshard_after_forward=reshard_after_forward)
                self.unit_names.append(name)
        fully_shard(module, mesh=self.device_mesh, reshard_after_forward=reshard_after_forward)
        self.unit_names.append("(root)")
        for name, p in module.named_parameters():
            for key, value in attrs.get(name, {}).items():
                setattr(p, key, value)
            p.is_torch_fsdp2_param = True   # Megatron's mark for a DTensor parameter
        if getattr(config, "calculate_per_token_loss", False):
            # Per-token loss: gradients are *summed* over dp and finalize_model_grads divides
            # them by the global token count (scale_gradients), as DDP's are. FSDP2 averages by
            # default; a divide factor of 1 with sum-only reductions makes it a plain sum (gloo
            # has no pre-multiplied sum, which a factor alone would ask for).
            for sub in module.modules():
                if hasattr(sub, "set_gradient_divide_factor"):
                    sub.set_gradient_divide_factor(1.0)
                    sub.set_force_sum_reduction_for_comms(True)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """The model's sharded state dict, each DTensor parameter cut to the rows this rank holds
        (Megatron's make_tp_sharded_tensor_for_checkpoint does the same for its FSDP2 params)."""
        return map_leaves(_own_rows_of_dtensor, self.module.sharded_state_dict(prefix, sharded_offsets, metadata))

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    @contextmanager
    def no_sync(self):
        """FSDP2 reduce-scatters every micro-batch (no rank keeps a whole gradient to add into),
        as Megatron's wrapper does: there is nothing to hold back."""
        yield

    def finish_grad_sync(self) -> None:
        """Nothing waits here: backward has reduce-scattered every unit's gradients already."""

    def scale_gradients(self, scaling_factor: float) -> None:
        """Per-token loss: divide by the global token count (each rank scales its rows)."""
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.mul_(scaling_factor)

    def zero_grad_buffer(self) -> None:
        """No buffer: the optimizer's zero_grad drops each DTensor gradient."""

    def start_param_sync(self, *unused, force_sync: bool = False) -> None:
        """--overlap-param-gather's entry point: FSDP2 gathers at each unit's forward."""

    def bytes_held(self) -> dict:
        """What this rank holds now, in bytes, counted by storage: each parameter's padded rows
        (gathered units' whole parameters too) and the gradients' reduce-scatter outputs."""
        def total(tensors):
            storages = {}
            for t in tensors:
                local = t.to_local() if hasattr(t, "to_local") else t
                storages[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
            return sum(storages.values())
        params = list(self.module.parameters())
        return {"params": total(params), "grads": total(p.grad for p in params if p.grad is not None)}


# --- checkpoints: a DTensor parameter as the rows this rank holds -------------------------------
#
# The model's sharded_state_dict describes a parameter as if this rank held all of it (its
# tensor-parallel slice, at its offset). FSDP2 holds rows [lo, hi) of it, cut as torch.chunk
# cuts dim 0 (ceil(rows / dp) each, the last ranks fewer or none). So each entry becomes those
# rows, at offset + lo along the parameter's first axis: a rectangle of the same global tensor
# that DDP's entry covers whole. Every rank's rows differ, so every rank writes its own (the
# data-parallel place of the replica id becomes 0, as Megatron sets it for FSDP2).


def _rows(param) -> tuple[int, int, torch.Tensor]:
    """(first row, end row, this rank's rows) of a DTensor parameter sharded by fully_shard."""
    local = param.detach().to_local()
    rows, mesh = param.shape[0], param.device_mesh
    per = -(-rows // mesh.size())
    lo = min(mesh.get_local_rank() * per, rows)
    if local.shape[0] != min(per, rows - lo):   # a placement this cut does not describe
        raise ValueError(f"a DTensor parameter of {rows} rows holds {local.shape[0]} here, not rows "
                         f"{lo}..{lo + per} of torch.chunk's cut: its placement is {param.placements}")
    return lo, lo + local.shape[0], local


def _cut(sh: ShardedTensor, first: int, local: torch.Tensor, lo: int) -> ShardedTensor:
    """Of ``sh`` (param rows [first, first + its rows)), the rows in ``local`` (param rows
    [lo, lo + len(local))), pointing into ``local``; empty if none."""
    a = max(first, lo)
    b = max(a, min(first + sh.local_shape[0], lo + local.shape[0]))
    data = local[a - lo:b - lo]
    offset = list(sh.global_offset)
    offset[sh.prepend_axis_num] += a - first
    # Every rank's rows are its own, so each writes them: the data-parallel place is 0. (An empty
    # piece, which a rank of rows past the piece's has, is skipped by the checkpoint's writer.)
    replica = (*sh.replica_id[:-1], 0) if isinstance(sh.replica_id, tuple) else 0
    return replace(sh, data=data, dtype=data.dtype, local_shape=tuple(data.shape), global_offset=tuple(offset),
                   axis_fragmentations=None, replica_id=replica)


def _own_rows_of_dtensor(entry):
    data = getattr(entry, "data", None)
    if not hasattr(data, "device_mesh"):   # not a DTensor: a buffer (rotary's inv_freq), kept whole
        return entry
    lo, _, local = _rows(data)
    if isinstance(entry, ShardedTensor):
        return _cut(entry, 0, local, lo)
    # A factory (SwiGLU's fc1 at tp > 1: gate rows, then up rows, under two global places): build
    # it on a stand-in of the whole parameter, where each piece's first row is its storage offset,
    # then keep each piece's rows that this rank holds. The optimizer's moments reuse build with
    # their own local rows (dist_checkpointing/optimizer.py), so build takes local rows.
    whole = torch.empty(data.shape, dtype=data.dtype, device="meta")
    row = whole[0].numel()

    def build(key, rows, replica_id):
        pieces = []
        for piece in entry.build_fn(key, whole, replica_id):
            if not piece.data.is_contiguous() or piece.data.shape[1:] != whole.shape[1:]:
                raise ValueError(f"{key}: a piece that is not whole rows cannot be cut by FSDP2's rows")
            pieces.append(_cut(piece, piece.data.storage_offset() // row, rows, lo))
        return pieces

    def merge(pieces):   # the pieces, loaded, in order of their rows: this rank's rows
        return torch.cat(pieces)
    return ShardedTensorFactory(entry.key, local, build, merge, entry.replica_id)
