"""Data-parallel gradients: contiguous buffers, buckets, DDP, and the per-step finalisation.

Importing the package imports no torch: DistributedDataParallel and finalize_model_grads load
on first use (a module-level __getattr__), because the memory estimator, which must stay
torch-free, reads the buffer's padding from distributed_data_parallel_config.py, and importing
any module of a package runs its __init__ first.
"""

from minitron.core.distributed.distributed_data_parallel_config import DistributedDataParallelConfig

__all__ = ["DistributedDataParallel", "DistributedDataParallelConfig", "finalize_model_grads"]


def __getattr__(name: str):
    if name == "DistributedDataParallel":
        # lazy: needs torch, which importing this package must not start (see above)
        from minitron.core.distributed.distributed_data_parallel import DistributedDataParallel as found
    elif name == "finalize_model_grads":
        # lazy: needs torch, which importing this package must not start (see above)
        from minitron.core.distributed.finalize_model_grads import finalize_model_grads as found
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # Keep the answer. For finalize_model_grads this also matters: loading the submodule of that
    # name binds the *module* here, and the function must be what the package's name means.
    globals()[name] = found
    return found
