"""finalize_model_grads' tensor- and pipeline-parallel sums, on the pieces FSDP keeps.

finalize_model_grads (core/distributed/finalize_model_grads.py) sums two kinds of gradient
beyond data parallelism: a replicated parameter that each tensor-parallel rank trained on part
of the data (sequence parallelism's layernorms, per-head qk norms), over the TP group; and the
tied embedding, over the first and last pipeline stage. It reads each parameter's whole
gradient, which FSDP does not keep: after the data-parallel reduction rank r holds only the
piece of each unit it owns (unit.piece). Megatron sums the local shards of its DTensor
gradients there instead; here the same, on the pieces:

* the TP ranks of one dp rank build the same units from same-shaped parameters, so they own
  the same piece of each parameter: summing the pieces over TP sums the gradient;
* the tied embedding is a unit of its own on both stages (fully_sharded_data_parallel.py),
  so both stages cut it into the same pieces: summing them over the embedding group is
  the sum of the two copies' gradients, and each copy's optimizer piece steps the same value.
"""

from __future__ import annotations

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from minitron.core import parallel_state
from minitron.core.distributed.finalize_model_grads import _is_partial_over_tp


def _grad_pieces(fsdp, params) -> list:
    found = (fsdp.unit_of[p].piece(p) for p in params)
    return [grad for piece in found if piece is not None for grad in [piece[1]] if grad.numel()]


def sum_partial_pieces_over_tp(fsdp) -> None:
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return
    config = fsdp.config
    params = [p for name, p in fsdp.module.named_parameters()
              if p in fsdp.unit_of and _is_partial_over_tp(name, p, config)]
    grads = _grad_pieces(fsdp, params)
    if not grads:
        return   # the same on every TP rank: they own the same pieces
    flat = _flatten_dense_tensors(grads)
    torch.distributed.all_reduce(flat, group=parallel_state.get_tensor_model_parallel_group())
    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(synced)


def sum_tied_embedding_pieces_over_stages(fsdp) -> None:
    tied = [unit for unit in fsdp.units if unit.name == "(tied embedding)"]
    for unit in tied:
        for grad in _grad_pieces(fsdp, unit.params):
            torch.distributed.all_reduce(grad, group=parallel_state.get_embedding_group())
