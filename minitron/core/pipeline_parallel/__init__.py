"""Pipeline parallelism: the schedules and the point-to-point traffic between stages.

Megatron's training loop asks this package (not a module in it) for the schedule, as here.
Importing the package imports no torch: the schedules load when the first schedule is asked
for, because the memory estimator (which must stay torch-free) reads the warm-up count from
pp_rank_microbatches.py in this package.
"""


def get_forward_backward_func():
    """The schedule this layout needs (Megatron picks it the same way)."""
    # lazy: the schedules and parallel_state need torch; importing this package must not (above)
    from minitron.core import parallel_state as mpu
    from minitron.core.pipeline_parallel.schedules import (
        forward_backward_no_pipelining, forward_backward_pipelining_without_interleaving,
    )
    from minitron.core.pipeline_parallel.schedules_interleaved import forward_backward_pipelining_with_interleaving

    if mpu.get_pipeline_model_parallel_world_size() > 1:
        if mpu.get_virtual_pipeline_model_parallel_world_size() is not None:
            return forward_backward_pipelining_with_interleaving
        return forward_backward_pipelining_without_interleaving
    return forward_backward_no_pipelining
