"""How a pipeline rank splits its micro-batches into warm-up, steady state and cool-down.

Megatron counts this once, in ``get_pp_rank_microbatches`` (megatron/core/pipeline_parallel/
schedules.py), and so do we, in a file of its own: schedules.py needs torch, and the memory
estimator (training/theoretical_activations.py), which must not import torch, asks the same
question of every pipeline rank to know how many micro-batches' activations it holds at once.
The schedules import it from here, so the count the estimate uses is the count that runs.
"""

from __future__ import annotations


def get_pp_rank_microbatches(num_microbatches: int, num_model_chunks: int,
                             microbatch_group_size_per_vp_stage: int, forward_only: bool = False, *,
                             pipeline_parallel_size: int, pipeline_parallel_rank: int,
                             virtual_pipeline_parallel_size: int | None = None) -> tuple[int, bool, int, int]:
    """(total, are_all_microbatches_in_warmup, num_warmup_microbatches, num_microbatches_remaining)
    for one pipeline rank; "total" counts (micro-batch, model chunk) steps.

    Megatron reads the three sizes from parallel_state (or a P2PCommunicator); here the caller
    passes them, so that the estimator, which has no process groups, can ask for any rank.

    1F1B (no virtual pipeline): stage r runs pp - r - 1 forwards before its first backward, just
    enough for the last stage's first gradient to be on its way back when r needs it.
    Interleaved: every rank first runs (v - 1) groups of micro-batches through its earlier
    chunks, then two more forwards per stage below it, because a gradient now crosses each
    stage twice as often. With exactly pp micro-batches everything is warm-up (Megatron's rule
    up to 0.11, which this schedule's code follows; 0.19 leaves the last ranks a steady state).
    """
    total = num_microbatches * num_model_chunks
    pp, rank = pipeline_parallel_size, pipeline_parallel_rank
    if forward_only:
        warmup = total
    elif pp == 1:
        warmup = 0
    elif virtual_pipeline_parallel_size is None:
        warmup = pp - rank - 1
    elif num_microbatches == pp:
        warmup = total
    else:
        warmup = (pp - rank - 1) * 2 + (num_model_chunks - 1) * microbatch_group_size_per_vp_stage
    warmup = min(warmup, total)
    return total, warmup == total, warmup, total - warmup
