"""Megatron-FSDP: data parallelism that shards what plain replicas keep whole.

Megatron's ``--data-parallel-sharding-strategy`` names how much of a replica each of the dp
ranks keeps (Megatron's default is the most sharded, ``optim_grads_params``):

    no_shard            everything whole on every rank; gradients all-reduced (plain DDP)
    optim               the optimizer steps only this rank's 1/dp of each unit (ZeRO-1)
    optim_grads         ... and only that 1/dp of the reduced gradient is kept (ZeRO-2)
    optim_grads_params  ... and of the parameters: each unit is all-gathered just before its
                        forward and its backward and freed after (ZeRO-3)

A *unit* is one transformer layer, or what is left of the chunk (embedding, final norm,
output layer): the granularity of the gathers (unit.py). The wrapper that hooks the units
into forward and backward is fully_sharded_data_parallel.py; the optimizer over the shards is
fsdp_optimizer.py; the tensor- and pipeline-parallel gradient sums on the shards, finalize.py;
building the units one at a time from a meta model (--init-model-with-meta-device),
meta_init.py. The checkpoint (--ckpt-format fsdp_dtensor) is training/checkpointing_fsdp_dtensor.py.

Importing this package imports no torch (the memory estimator reads STRATEGIES).
"""

STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
DEFAULT_STRATEGY = "optim_grads_params"   # Megatron's default for --data-parallel-sharding-strategy

__all__ = ["STRATEGIES", "DEFAULT_STRATEGY", "FullyShardedDataParallel", "get_fsdp_optimizer"]


def __getattr__(name: str):
    if name == "FullyShardedDataParallel":
        # lazy: it needs torch, which importing the package must not start (see above)
        from minitron.core.distributed.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel as found
    elif name == "get_fsdp_optimizer":
        # lazy: it needs torch, which importing the package must not start (see above)
        from minitron.core.distributed.fsdp.fsdp_optimizer import get_fsdp_optimizer as found
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = found
    return found
