"""finalize_model_grads: everything that must happen to the gradients between backward and step.

The pipeline schedule calls it once, after the last micro-batch's backward
(``config.finalize_model_grads_func``). Three reductions, over three different groups:

1. data parallel: each model chunk finishes its bucket all-reduces / reduce-scatters (MoE
   experts' buckets run over the expert-data-parallel group, see DistributedDataParallel);
2. tensor parallel, with sequence parallelism: replicated parameters (layernorm weights and
   biases, row-parallel biases) saw only this rank's part of the sequence, so their gradients
   are partial and are summed over the TP group;
3. the embedding group (first + last pipeline stage): the tied word embedding lives twice, as
   the input embedding on the first stage and the output layer on the last. Each copy got the
   gradient of its own use; their sum is the true gradient, and both copies apply it.
"""

from __future__ import annotations

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from minitron.core import parallel_state
from minitron.core.transformer.moe.moe_utils import finish_router_step
from minitron.core.utils import to_local_if_dtensor
from minitron.trace import traced


def _unwrap_to(module, attr: str):
    """Peel wrappers (DDP, Float16Module) via ``.module`` until one has ``attr``; None if none."""
    while not hasattr(module, attr):
        module = getattr(module, "module", None)
        if module is None:
            return None
    return module


def _grad_of(param: torch.Tensor) -> torch.Tensor | None:
    """The gradient the optimizer will read: DDP's main_grad if there is one, else .grad."""
    return param.main_grad if hasattr(param, "main_grad") else param.grad


def _allreduce_word_embedding_grads(model, config) -> None:
    """Sum the tied embedding's gradient over the first and last pipeline stage."""
    if parallel_state.get_pipeline_model_parallel_world_size() == 1:
        return  # one stage: input and output already share one Parameter, autograd summed it
    if not parallel_state.is_rank_in_embedding_group(ignore_virtual=True):
        return
    if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        chunk = model[-1]   # with virtual stages, the output layer is in the last chunk
    else:
        chunk = model[0]
    inner = _unwrap_to(chunk, "shared_embedding_or_output_weight")
    # Copies to keep equal: a tied output layer's, or multi-token prediction's embedding.
    if inner is None or not (getattr(inner, "share_embeddings_and_output_weights", False)
                             or getattr(config, "mtp_num_layers", None)):
        return
    weight = inner.shared_embedding_or_output_weight()
    grad = None if weight is None else _grad_of(weight)
    if grad is not None:
        torch.distributed.all_reduce(grad, group=parallel_state.get_embedding_group())


def _is_partial_over_tp(name: str, param, config) -> bool:
    """A replicated parameter that each TP rank trains on part of the data: its part of the
    sequence (sequence parallelism), or its own heads (--qk-layernorm's per-head norms)."""
    if getattr(config, "sequence_parallel", False) and getattr(param, "sequence_parallel", False):
        return True
    # Multi-latent attention's q_layernorm / kv_layernorm normalise the whole latent on every
    # rank (its gradient arrives complete, through the up projection's all-reduce): not partial.
    per_head = getattr(config, "qk_layernorm", False) and not getattr(config, "multi_latent_attention", False)
    return per_head and ("q_layernorm" in name or "k_layernorm" in name)


def _allreduce_layernorm_grads(model, config) -> None:
    """Sum the partial gradients of replicated parameters over TP (Megatron's
    _allreduce_non_tensor_model_parallel_grads)."""
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return
    grads = [_grad_of(param) for chunk in model for name, param in chunk.named_parameters()
             if param.requires_grad and _is_partial_over_tp(name, param, config)]
    # Under FSDP2 each is a DTensor of this rank's rows: the same rows on every TP rank, so their
    # local parts are what is summed (a view: the sum lands in the DTensor).
    grads = [to_local_if_dtensor(g) for g in grads if g is not None]
    if not grads:
        return
    # One collective for all of them: flatten, reduce, copy back.
    flat = _flatten_dense_tensors(grads)
    torch.distributed.all_reduce(flat, group=parallel_state.get_tensor_model_parallel_group())
    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(synced)


@traced(args=lambda model, num_tokens=None: {"chunks": len(model), "per_token": num_tokens is not None})
def finalize_model_grads(model, num_tokens: torch.Tensor | None = None) -> None:
    """Finish every gradient reduction of this step; ``model`` is the list of model chunks.

    ``num_tokens`` (per-token loss): this rank's count of loss tokens. It is summed over the
    data-parallel ranks and every gradient is divided by the total, so the update is the mean
    over the tokens of the whole global batch rather than a mean of per-rank means.
    """
    config = model[0].config
    for chunk in model:
        chunk.finish_grad_sync()
    _allreduce_layernorm_grads(model, config)
    _allreduce_word_embedding_grads(model, config)
    if getattr(config, "num_moe_experts", None):   # the routers' per-step state (moe_utils)
        finish_router_step(model, config)
    if num_tokens is not None:
        # Only the last stage computes the loss and knows the count: it tells its stage peers.
        last = parallel_state.get_pipeline_model_parallel_last_rank()
        torch.distributed.broadcast(num_tokens, src=last,
                                    group=parallel_state.get_pipeline_model_parallel_group())
        torch.distributed.all_reduce(num_tokens,
                                     group=parallel_state.get_data_parallel_group(with_context_parallel=True))
        if num_tokens.item() > 0:
            for chunk in model:
                chunk.scale_gradients(1.0 / num_tokens.item())
