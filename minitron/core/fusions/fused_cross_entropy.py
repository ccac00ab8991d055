"""Vocab-parallel cross entropy from compiled pieces (Megatron's fused_cross_entropy.py,
``--cross-entropy-loss-fusion``).

The arithmetic is tensor_parallel/cross_entropy.py's (read that first); the logits are the
largest activation of the model, [s, b, V/p], and what changes is how often they cross memory.
Unfused, the forward makes an fp32 copy, shifts it, exponentiates it, sums it and divides it,
and the backward writes the one-hot into it and scales it: each a pass over [s, b, V/p].
Here:

* forward: one compiled kernel per all-reduce step. The first reads the logits for their max;
  the second reads them again and writes their exps (shift, exp and sum fused), picking the
  target's logit on the way. The softmax is never written: backward divides as it goes.
* backward: one kernel reads the exps and writes the gradient, in the logits' own dtype.
* the target's logit and the sum of exps travel in one all-reduce (stacked), not two, as
  Megatron batches them.

No label smoothing here (Megatron's fused path has none either); the GPT's loss uses none.
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state
from minitron.core.jit import jit_fuser
from minitron.core.tensor_parallel.cross_entropy import _all_reduce
from minitron.core.tensor_parallel.utils import VocabUtility
from minitron.trace import traced
from minitron.trace.recorder import short_value


@jit_fuser
def calculate_logits_max(logits: torch.Tensor) -> torch.Tensor:
    return logits.float().max(dim=-1).values


@jit_fuser
def calculate_predicted_logits(logits, target, logits_max, vocab_start: int, vocab_end: int):
    """(target_mask, masked_target, [target logit; sum of exps] stacked, exps), shifted by the max."""
    shifted = logits.float() - logits_max.unsqueeze(-1)
    target_mask = (target < vocab_start) | (target >= vocab_end)   # True: another rank owns it
    masked_target = (target - vocab_start).masked_fill(target_mask, 0)
    predicted = shifted.gather(-1, masked_target.unsqueeze(-1)).squeeze(-1).masked_fill(target_mask, 0.0)
    exp_logits = shifted.exp()
    return target_mask, masked_target, torch.stack((predicted, exp_logits.sum(dim=-1))), exp_logits


@jit_fuser
def calculate_gradients(exp_logits, sum_exp_logits, target_mask, masked_target, grad_output, dtype: torch.dtype):
    """dL/dz = (softmax - onehot(target)) * grad, the one-hot only on the rank that owns the target."""
    softmax = exp_logits / sum_exp_logits.unsqueeze(-1)
    ids = torch.arange(exp_logits.size(-1), device=exp_logits.device)
    onehot = (ids == masked_target.unsqueeze(-1)) & ~target_mask.unsqueeze(-1)
    return ((softmax - onehot.float()) * grad_output.unsqueeze(-1)).to(dtype)


class _VocabParallelCrossEntropy(torch.autograd.Function):

    @staticmethod
    def forward(ctx, vocab_parallel_logits, target):
        group = parallel_state.get_tensor_model_parallel_group()
        # Detached: the compiled pieces guard on requires_grad, and evaluation (no grad) would
        # compile each a second time for a flag that forward, under no_grad anyway, never reads.
        logits = vocab_parallel_logits.detach()
        logits_max = calculate_logits_max(logits)
        _all_reduce(logits_max, torch.distributed.ReduceOp.MAX, group)
        start, end = VocabUtility.vocab_range_from_per_partition_vocab_size(
            logits.size(-1), group.rank(), group.size())
        target_mask, masked_target, predicted_and_sum, exp_logits = calculate_predicted_logits(
            logits, target, logits_max, start, end)
        _all_reduce(predicted_and_sum, torch.distributed.ReduceOp.SUM, group)
        predicted_logits, sum_exp_logits = predicted_and_sum
        ctx.save_for_backward(exp_logits, sum_exp_logits, target_mask, masked_target)
        ctx.logits_dtype = logits.dtype
        return torch.log(sum_exp_logits) - predicted_logits

    @staticmethod
    def backward(ctx, grad_output):
        grad = calculate_gradients(*ctx.saved_tensors, grad_output, ctx.logits_dtype)
        return grad, None


@traced(args=lambda vocab_parallel_logits, target: {
    "logits": short_value(vocab_parallel_logits), "target": short_value(target)})
def fused_vocab_parallel_cross_entropy(vocab_parallel_logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-token loss [s, b] from this rank's logits [s, b, V/p] and the targets [s, b]: the
    numbers of ``vocab_parallel_cross_entropy`` (no label smoothing), from fewer passes."""
    return _VocabParallelCrossEntropy.apply(vocab_parallel_logits, target)
