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
    stage twice as often. (Megatron up to 0.11 made everything warm-up when there were exactly
    pp micro-batches; 0.19, like this count, leaves the last ranks a steady state: the schedule
    table below lets a rank buffer inputs it received early, which that rule worked around.)
    """
    total = num_microbatches * num_model_chunks
    pp, rank = pipeline_parallel_size, pipeline_parallel_rank
    if forward_only:
        warmup = total
    elif pp == 1:
        warmup = 0
    elif virtual_pipeline_parallel_size is None:
        warmup = pp - rank - 1
    else:
        warmup = (pp - rank - 1) * 2 + (num_model_chunks - 1) * microbatch_group_size_per_vp_stage
    warmup = min(warmup, total)
    return total, warmup == total, warmup, total - warmup


def get_schedule_table(num_microbatches: int, num_model_chunks: int,
                       microbatch_group_size_per_vp_stage: int) -> list[tuple[int, int]]:
    """The interleaved schedule's forward order: step k runs (microbatch_id, model_chunk_id).

    Micro-batches go through the chunks in groups of N (``microbatch_group_size_per_vp_stage``):
    N micro-batches through chunk 0, the same N through chunk 1, ..., then the next N. The last
    group takes whatever is left, which may be more or fewer than N; that is how any number of
    micro-batches fits. E.g. pp 2, v 2, N 3, five micro-batches:
    micro-batch 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1.
    N must be at least pp: the first rank's chunk c + 1 waits for what the last rank's chunk c
    sent, pp - 1 steps after it ran.
    """
    table = []
    for start in range(0, num_microbatches, microbatch_group_size_per_vp_stage):
        end = start + microbatch_group_size_per_vp_stage
        end = num_microbatches if end >= num_microbatches else end  # the last group: the rest
        table += [(mb, chunk) for chunk in range(num_model_chunks) for mb in range(start, end)]
    return table


def check_microbatch_group_size(num_microbatches: int, pipeline_parallel_size: int,
                                microbatch_group_size_per_vp_stage: int) -> str | None:
    """Why this group size cannot run the interleaved schedule (one line), or None.

    Megatron's two conditions: the group size lies in [pp, M]; and the last group is either a
    full one or at least pp long. A shorter last group would have the first rank wait for
    activations that leave the last rank only after it finishes other work: a dependency the
    1F1B exchange order cannot express (Megatron refuses it for the bubble it makes).
    """
    n, pp, m = microbatch_group_size_per_vp_stage, pipeline_parallel_size, num_microbatches
    if not pp <= n <= m:
        return (f"--microbatch-group-size-per-virtual-pipeline-stage {n} must lie in "
                f"[pipeline size {pp}, number of micro-batches {m}]")
    if 0 < m % n < pp:
        return (f"the {m} micro-batches leave a last group of {m % n} (groups of "
                f"--microbatch-group-size-per-virtual-pipeline-stage {n}): it must be 0 or at least "
                f"the pipeline size {pp}; use a group size that divides {m}, or {m}")
    return None
