"""Megatron-Core's distributed checkpointing: sharded state dicts saved once, read by any layout.

mapping.py        ShardedTensor, ShardedObject, ShardedTensorFactory: a local piece and its
                  place in the global tensor
torch_dist.py     the bridge to torch.distributed.checkpoint (DCP), which writes and reads them
serialization.py  save / load (Megatron's entry points)
optimizer.py      the optimizer's state as ShardedTensors shaped like the parameters
earlier_keys.py   checkpoints of earlier minitron versions (their MoE keys), read under today's
file_owner.py     each .distcp file signed by the rank that wrote it (checked before a load)
"""

from minitron.core.dist_checkpointing.mapping import (  # noqa: F401 -- the package's names
    CheckpointingException, ShardedObject, ShardedTensor, ShardedTensorFactory, is_main_replica,
)


def __getattr__(name: str):
    """save and load on first use: they bring torch.distributed.checkpoint (0.65 s of imports),
    and every rank imports this package through the layers' sharded_state_dict helpers
    (core/transformer/utils.py), checkpoint or not."""
    if name in ("save", "load"):
        # lazy: see the docstring above
        from minitron.core.dist_checkpointing import serialization
        return getattr(serialization, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
