"""Data-parallel gradients: contiguous buffers, buckets, DDP, and the per-step finalisation.

Importing the package imports no torch: DistributedDataParallel loads on first use (a
module-level __getattr__), because the memory estimator, which must stay torch-free, reads the
buffer's padding from distributed_data_parallel_config.py, and importing any module of a package
runs its __init__ first.

finalize_model_grads is imported from its module (``from
minitron.core.distributed.finalize_model_grads import finalize_model_grads``), not from here as
Megatron's eager __init__ allows: once anything has loaded that module, Python binds the
package's attribute of the same name to the *module*, and a lazy name here would then hand out
the module instead of the function.
"""

from minitron.core.distributed.distributed_data_parallel_config import DistributedDataParallelConfig

__all__ = ["DistributedDataParallel", "DistributedDataParallelConfig"]


def __getattr__(name: str):
    if name == "DistributedDataParallel":
        # lazy: needs torch, which importing this package must not start (see above)
        from minitron.core.distributed.distributed_data_parallel import DistributedDataParallel as found
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = found   # keep the answer
    return found
