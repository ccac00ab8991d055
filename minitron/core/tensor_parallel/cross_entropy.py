"""Cross entropy over logits whose vocabulary is split across the tensor-parallel ranks.

The output layer is column-parallel, so rank r holds logits for vocabulary ids [start, end)
only: [s, b, V/p]. Gathering them would put a [s, b, V] tensor on every rank (for V = 50k,
s = 2048, b = 8 that is 3.3 GB in fp32). Softmax cross entropy needs only three numbers per
token from the whole vocabulary, and each is a reduction, so each rank reduces its slice and
one all-reduce of [s, b] combines them:

    loss = log(sum_j exp(z_j - m)) - (z_target - m),   m = max_j z_j

    1. m:            local max, all-reduce MAX       (for a stable exp)
    2. z_target - m: the rank that owns the target writes it, the rest write 0; all-reduce SUM
    3. sum exp:      local sum, all-reduce SUM

The gradient needs no communication: dL/dz_j = softmax_j - [j == target], and each rank has
softmax for its own slice (its exps over the global sum).
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state
from minitron.core.tensor_parallel.utils import VocabUtility
from minitron.trace import traced
from minitron.trace.recorder import short_value


def _all_reduce(tensor: torch.Tensor, op, group) -> None:
    if group.size() > 1:  # one rank: nothing to combine (Megatron calls it anyway; it is a no-op)
        torch.distributed.all_reduce(tensor, op=op, group=group)


# --8<-- [start:forward]
class _VocabParallelCrossEntropy(torch.autograd.Function):

    @staticmethod
    def forward(ctx, vocab_parallel_logits, target, label_smoothing=0.0):
        group = parallel_state.get_tensor_model_parallel_group()
        rank, world_size = group.rank(), group.size()
        logits = vocab_parallel_logits.float()

        logits_max = logits.max(dim=-1).values
        _all_reduce(logits_max, torch.distributed.ReduceOp.MAX, group)
        # One new [s, b, V/p] buffer, the caller's logits stay as they were. It holds the
        # shifted logits, then (in place) their exps, then the softmax that backward needs:
        # the largest activation of the model is allocated once, not three times (Megatron
        # works in place too; it overwrites the caller's logits, minitron does not).
        shifted = logits - logits_max.unsqueeze(-1)

        partition_vocab_size = logits.size(-1)
        start, end = VocabUtility.vocab_range_from_per_partition_vocab_size(
            partition_vocab_size, rank, world_size)
        target_mask = (target < start) | (target >= end)  # True: another rank owns this target
        masked_target = (target - start).masked_fill(target_mask, 0)
        predicted_logits = shifted.gather(-1, masked_target.unsqueeze(-1)).squeeze(-1)
        predicted_logits = predicted_logits.masked_fill(target_mask, 0.0)
        _all_reduce(predicted_logits, torch.distributed.ReduceOp.SUM, group)
        sum_shifted = shifted.sum(dim=-1) if label_smoothing > 0 else None  # before exp_ below

        exp_logits = shifted.exp_()
        sum_exp_logits = exp_logits.sum(dim=-1)
        _all_reduce(sum_exp_logits, torch.distributed.ReduceOp.SUM, group)

        loss = torch.log(sum_exp_logits) - predicted_logits
        softmax = exp_logits.div_(sum_exp_logits.unsqueeze(-1))
# --8<-- [end:forward]

# --8<-- [start:label_smoothing]
        vocab_size = partition_vocab_size * world_size
        if label_smoothing > 0:
            # Megatron's convention: the smoothing mass alpha is spread over the K-1 wrong ids.
            # That equals torch's label_smoothing=alpha*K/(K-1) (which spreads over all K ids).
            smoothing = label_smoothing * vocab_size / (vocab_size - 1)
            # The mean log-probability must be over the WHOLE vocabulary. Megatron averages
            # over the local slice only (its issue #737), which makes the loss differ across
            # TP ranks. mean_j log p_j = mean_j (z_j - m) - log(sum exp): one more all-reduce,
            # of shifted logits rather than log(softmax), so an underflowed p_j cannot give -inf.
            _all_reduce(sum_shifted, torch.distributed.ReduceOp.SUM, group)
            mean_log_probs = sum_shifted / vocab_size - torch.log(sum_exp_logits)
            loss = (1.0 - smoothing) * loss - smoothing * mean_log_probs
        else:
            smoothing = 0.0
        ctx.smoothing, ctx.vocab_size = smoothing, vocab_size
        ctx.save_for_backward(softmax, target_mask, masked_target)
        return loss
# --8<-- [end:label_smoothing]

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target = ctx.saved_tensors
        # dL/dz = softmax - (1 - smoothing) * onehot(target) - smoothing / K. Only the rank
        # that owns the target subtracts the one-hot part; the others' mask is 0 there.
        # Written into the saved softmax, which nothing reads after this (as Megatron does):
        # no second [s, b, V/p] buffer. The price: this graph cannot be run backward twice.
        if ctx.smoothing is None:
            raise RuntimeError("vocab_parallel_cross_entropy's backward ran twice (retain_graph?): "
                               "its saved softmax became the first gradient")
        owns_target = (~target_mask).to(softmax.dtype).unsqueeze(-1)
        grad = softmax.scatter_add_(-1, masked_target.unsqueeze(-1), -(1.0 - ctx.smoothing) * owns_target)
        if ctx.smoothing > 0:
            grad.sub_(ctx.smoothing / ctx.vocab_size)
        ctx.smoothing = None
        return grad.mul_(grad_output.unsqueeze(-1)), None, None


@traced(args=lambda vocab_parallel_logits, target, label_smoothing=0.0: {
    "logits": short_value(vocab_parallel_logits), "target": short_value(target),
    "label_smoothing": label_smoothing})
def vocab_parallel_cross_entropy(vocab_parallel_logits: torch.Tensor, target: torch.Tensor,
                                 label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-token loss [s, b] from this rank's logits [s, b, V/p] and the targets [s, b].

    Every rank of the TP group returns the same loss. ``label_smoothing`` follows Megatron's
    convention (see the forward), computed over the whole vocabulary.
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing={label_smoothing}: use a value in [0, 1)")
    return _VocabParallelCrossEntropy.apply(vocab_parallel_logits, target, label_smoothing)
