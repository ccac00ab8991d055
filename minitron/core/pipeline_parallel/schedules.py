"""Forward/backward schedules: how one global batch's micro-batches flow through the stages.

    forward_backward_no_pipelining                    pp = 1: forward, backward, repeat
    forward_backward_pipelining_without_interleaving  1F1B: warm-up, steady state, cool-down
    forward_backward_pipelining_with_interleaving     1F1B over several model chunks per rank
                                                      (schedules_interleaved.py)

get_forward_backward_func, which picks one for the layout, lives in the package's __init__.py
(``from minitron.core.pipeline_parallel import get_forward_backward_func``, Megatron's import):
it needs all three, and the interleaved one builds on the steps defined here.

All three return the last stage's per-micro-batch loss dicts and leave the gradients of the
whole global batch in the model, reduced across data-parallel ranks
(``config.finalize_model_grads_func``), ready for optimizer.step(). With
``config.calculate_per_token_loss`` they also add up the micro-batches' loss tokens and hand the
count to finalize_model_grads, which divides the gradients by the global batch's total.
"""

from __future__ import annotations

import contextlib

import torch
from torch.autograd.variable import Variable

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state as mpu
from minitron.core.pipeline_parallel import p2p_communication as p2p
from minitron.core.pipeline_parallel.loss_autoscalers import MoEAuxLossAutoScaler, MTPLossAutoScaler
from minitron.core.pipeline_parallel.pp_rank_microbatches import get_pp_rank_microbatches
from minitron.trace import traced


def get_attr_wrapped_model(model, attr: str):
    """``model.attr``, looking through the wrappers (DDP, Float16Module) that do not carry it."""
    while not hasattr(model, attr) and hasattr(model, "module"):
        model = model.module
    return getattr(model, attr)


def get_model_config(model):
    """The model's TransformerConfig, looking through wrappers."""
    return get_attr_wrapped_model(model, "config")


def _unwrap(model):
    while hasattr(model, "module") and not hasattr(model, "set_input_tensor"):
        model = model.module
    return model


def get_tensor_shape(config, seq_length: int, micro_batch_size: int):
    """[s, b, h] of the activation between stages; sequence parallel splits s across tp ranks."""
    seq = seq_length // mpu.get_context_parallel_world_size()
    if getattr(config, "sequence_parallel", False):
        seq //= mpu.get_tensor_model_parallel_world_size()
    return (seq, micro_batch_size, config.hidden_size)


def deallocate_output_tensor(out, deallocate_pipeline_outputs: bool = True):
    """Free a sent activation's storage but keep its autograd graph.

    Once the next stage has the activation, this stage needs only its ``grad_fn`` to run
    backward later. Shrinking ``.data`` to one element releases the memory of every
    micro-batch in flight — the point of 1F1B is to bound those, and this makes the bound real.
    """
    if out is None or not deallocate_pipeline_outputs or out._base is not None:
        return  # a view's storage belongs to its base: freeing it would free nothing
    out.data = torch.empty((1,), device=out.device, dtype=out.dtype)


def custom_backward(output, grad_output):
    """Backward from a deallocated output: torch.autograd.backward would reject the shape
    mismatch between the 1-element .data and the full gradient; the engine underneath does not
    look at .data at all."""
    Variable._execution_engine.run_backward(
        tensors=(output,), grad_tensors=(grad_output,), keep_graph=False, create_graph=False,
        inputs=tuple(), allow_unreachable=True, accumulate_grad=True)


def _step_args(*args, current_microbatch=None, vp_stage=None, **kwargs):
    """What the trace records for a forward/backward step: which micro-batch, which chunk."""
    return {"microbatch": current_microbatch, "chunk": vp_stage,
            "stage": mpu.get_pipeline_model_parallel_rank()}


@traced(args=_step_args)
def forward_step(forward_step_func, data_iterator, model, num_microbatches, input_tensor,
                 forward_data_store, config, current_microbatch=None, vp_stage=None):
    """Run the user's forward step on one micro-batch; on the last stage, turn output into loss.
    Returns (output, the micro-batch's loss tokens: 0 except on the stage that computes the loss)."""
    _unwrap(model).set_input_tensor(input_tensor)  # non-first stages start from the received activation
    output_tensor, loss_func = forward_step_func(data_iterator, model)
    return forward_step_calc_loss(output_tensor, loss_func, config, vp_stage, num_microbatches, forward_data_store)


def forward_step_calc_loss(output_tensor, loss_func, config, vp_stage, num_microbatches, forward_data_store,
                           cp_group_size=None, is_last_stage=None):
    """On the chunk that computes the loss, turn the model's output into the tensor backward
    starts from, and count the micro-batch's loss tokens: returns (loss, num_tokens).

    Two normalisations (Megatron's). By default each micro-batch's loss is its mean over its
    tokens, over ``num_microbatches``, and DDP averages over the data-parallel ranks: a mean of
    means, where a token in a short micro-batch weighs more than one in a long one. With
    ``config.calculate_per_token_loss`` the loss stays the *sum* over the micro-batch's tokens;
    the schedule adds up ``num_tokens`` and finalize_model_grads divides the gradients by their
    total over every micro-batch and data-parallel rank: every token of the global batch weighs
    the same, whatever the layout. (The logged loss is token-weighted either way: reduce_losses.)

    The sizes come from parallel_state unless given: DeepSpeed's train_step (training/
    deepspeed_training.py) passes its own (one micro-batch at a time, no context parallelism),
    so that both paths normalise the loss with this one function.
    """
    if is_last_stage is None:
        is_last_stage = mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    if cp_group_size is None:
        cp_group_size = mpu.get_context_parallel_world_size()
    per_token = getattr(config, "calculate_per_token_loss", False)   # no config: DeepSpeed's path
    num_tokens = torch.zeros([], dtype=torch.int, device=get_accelerator().current_device_name())
    if is_last_stage:
        outputs = loss_func(output_tensor)
        if len(outputs) == 3:  # (sum, token count, report)
            output_tensor, num_tokens, loss_reduced = outputs
            if not per_token:  # the mean over this micro-batch's tokens, over the micro-batches
                output_tensor = output_tensor / torch.clamp(num_tokens, min=1) / num_microbatches
        else:  # (mean, report), the older form: each cp rank's mean is of 1/cp of the tokens
            output_tensor, loss_reduced = outputs
            output_tensor = output_tensor * cp_group_size / num_microbatches
        forward_data_store.append(loss_reduced)
    if getattr(config, "num_moe_experts", None) is not None:   # whatever losses it has (z-loss too)
        # MoE: the load-balancing losses get the main loss's backward scale (moe_utils.py),
        # times cp as in Megatron: a cp rank's switch loss is its share of the micro-batch's
        # (its tokens over all the tokens), and the gradient reduction over dp-cp averages.
        # Per-token loss: Megatron gives them the plain scale, and the division by the global
        # token count in finalize_model_grads then applies to them too.
        one = torch.ones(1, device=output_tensor.device)
        scale = config.grad_scale_func(one) if config.grad_scale_func is not None else one
        MoEAuxLossAutoScaler.set_loss_scale(scale if per_token else scale * cp_group_size / num_microbatches)
    if getattr(config, "mtp_num_layers", None):   # multi-token prediction: the main loss's scale
        one = torch.ones(1, device=output_tensor.device)
        scale = config.grad_scale_func(one) if config.grad_scale_func is not None else one
        MTPLossAutoScaler.set_loss_scale(scale if per_token else scale / num_microbatches)
    return output_tensor, num_tokens


@traced(args=_step_args)
def backward_step(input_tensor, output_tensor, output_tensor_grad, config,
                  current_microbatch=None, vp_stage=None):
    """Backward through this stage for one micro-batch; return the gradient for the previous stage."""
    if input_tensor is not None:
        input_tensor.retain_grad()  # a received buffer is a leaf; keep its .grad to send back
    if output_tensor_grad is None and config.grad_scale_func is not None:
        output_tensor = config.grad_scale_func(output_tensor)  # fp16: scale the loss up
    if output_tensor_grad is not None and output_tensor.shape != output_tensor_grad.shape:
        custom_backward(output_tensor, output_tensor_grad)
    else:
        torch.autograd.backward(output_tensor, grad_tensors=output_tensor_grad)
    return input_tensor.grad if input_tensor is not None else None


def _no_sync(config):
    return config.no_sync_func() if config.no_sync_func is not None else contextlib.nullcontext()


def _finalize(config, model_chunks, forward_only: bool, total_num_tokens):
    """Reduce the gradients; with per-token loss, divide them by the global batch's token count."""
    if not forward_only and config.finalize_model_grads_func is not None:
        config.finalize_model_grads_func(model_chunks, total_num_tokens if config.calculate_per_token_loss else None)


@traced(args=lambda **kw: {"num_microbatches": kw.get("num_microbatches"), "forward_only": kw.get("forward_only", False)})
def forward_backward_no_pipelining(*, forward_step_func, data_iterator, model, num_microbatches,
                                   seq_length, micro_batch_size, forward_only=False, **_):
    """One stage: forward and backward each micro-batch in turn, accumulating gradients.

    Gradient reduction across data-parallel ranks is held back (no_sync) until the last
    micro-batch: reducing after every micro-batch would move the same bytes num_microbatches
    times for nothing.
    """
    model = model[0] if isinstance(model, list) else model
    data_iterator = data_iterator[0] if isinstance(data_iterator, list) else data_iterator
    config = get_model_config(model)
    losses = []
    total_num_tokens = torch.zeros([], dtype=torch.int, device=get_accelerator().current_device_name())

    def one(i):
        nonlocal total_num_tokens
        output, num_tokens = forward_step(forward_step_func, data_iterator, model, num_microbatches, None, losses,
                                          config, current_microbatch=i)
        total_num_tokens = total_num_tokens + num_tokens
        if not forward_only:
            backward_step(None, output, None, config, current_microbatch=i)

    with _no_sync(config):
        for i in range(num_microbatches - 1):
            one(i)
    one(num_microbatches - 1)
    _finalize(config, [model], forward_only, total_num_tokens)
    return losses


@traced(args=lambda **kw: {"num_microbatches": kw.get("num_microbatches"), "forward_only": kw.get("forward_only", False)})
def forward_backward_pipelining_without_interleaving(*, forward_step_func, data_iterator, model,
                                                     num_microbatches, seq_length, micro_batch_size,
                                                     forward_only=False, **_):
    """1F1B. Stage r first runs (pp - r - 1) forwards (warm-up) so the pipeline fills, then
    alternates one forward and one backward (steady state), then drains the backwards left
    (cool-down). A stage never holds more than pp - r activations at once, however many
    micro-batches the batch has: that is why 1F1B bounds activation memory where
    "all forwards, then all backwards" (GPipe) holds all of them.
    """
    model = model[0] if isinstance(model, list) else model
    data_iterator = data_iterator[0] if isinstance(data_iterator, list) else data_iterator
    config = get_model_config(model)
    shape = get_tensor_shape(config, seq_length, micro_batch_size)
    # Megatron writes min(pp - r - 1, m) out here; the count comes from the one function the
    # interleaved schedule and the estimator use. Forward-only 1F1B keeps the same warm-up.
    _, _, num_warmup, num_remaining = get_pp_rank_microbatches(
        num_microbatches, 1, 1, pipeline_parallel_size=mpu.get_pipeline_model_parallel_world_size(),
        pipeline_parallel_rank=mpu.get_pipeline_model_parallel_rank())
    input_tensors, output_tensors, losses = [], [], []
    dealloc = getattr(config, "deallocate_pipeline_outputs", True)

    # Hold back the data-parallel gradient reduction until the very last backward.
    no_sync = _no_sync(config)
    if not forward_only:
        no_sync.__enter__()
    fwd_id = bwd_id = 0
    total_num_tokens = torch.zeros([], dtype=torch.int, device=get_accelerator().current_device_name())

    def forward(input_tensor):
        nonlocal fwd_id, total_num_tokens
        out, num_tokens = forward_step(forward_step_func, data_iterator, model, num_microbatches, input_tensor,
                                       losses, config, current_microbatch=fwd_id)
        total_num_tokens = total_num_tokens + num_tokens
        fwd_id += 1
        return out

    def backward(input_tensor, output_tensor, output_grad):
        nonlocal bwd_id
        if bwd_id == num_microbatches - 1 and not forward_only:
            no_sync.__exit__(None, None, None)  # the last backward triggers the reduction
        grad = backward_step(input_tensor, output_tensor, output_grad, config, current_microbatch=bwd_id)
        bwd_id += 1
        return grad

    for _ in range(num_warmup):  # warm-up: forwards only
        input_tensor = p2p.recv_forward(shape, config)
        output_tensor = forward(input_tensor)
        p2p.send_forward(output_tensor, config)
        input_tensors.append(input_tensor)
        output_tensors.append(output_tensor)
        deallocate_output_tensor(output_tensor, dealloc)

    input_tensor = p2p.recv_forward(shape, config) if num_remaining > 0 else None
    for i in range(num_remaining):  # steady state: one forward, one backward
        last = i == num_remaining - 1
        output_tensor = forward(input_tensor)
        if forward_only:
            p2p.send_forward(output_tensor, config)
            input_tensor = None if last else p2p.recv_forward(shape, config)
            continue
        output_grad = p2p.send_forward_recv_backward(output_tensor, shape, config)
        input_tensors.append(input_tensor)
        output_tensors.append(output_tensor)
        deallocate_output_tensor(output_tensor, dealloc)
        input_grad = backward(input_tensors.pop(0), output_tensors.pop(0), output_grad)
        if last:
            input_tensor = None
            p2p.send_backward(input_grad, config)
        else:
            input_tensor = p2p.send_backward_recv_forward(input_grad, shape, config)

    if not forward_only:
        for _ in range(num_warmup):  # cool-down: the backwards the warm-up still owes
            output_grad = p2p.recv_backward(shape, config)
            input_grad = backward(input_tensors.pop(0), output_tensors.pop(0), output_grad)
            p2p.send_backward(input_grad, config)
    _finalize(config, [model], forward_only, total_num_tokens)
    return losses
