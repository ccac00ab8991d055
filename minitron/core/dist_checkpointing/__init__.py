"""Megatron-Core's distributed checkpointing: sharded state dicts saved once, read by any layout.

mapping.py        ShardedTensor, ShardedObject, ShardedTensorFactory: a local piece and its
                  place in the global tensor
torch_dist.py     the bridge to torch.distributed.checkpoint (DCP), which writes and reads them
serialization.py  save / load (Megatron's entry points)
optimizer.py      the optimizer's state as ShardedTensors shaped like the parameters
"""

from minitron.core.dist_checkpointing.mapping import (  # noqa: F401 -- the package's names
    CheckpointingException, ShardedObject, ShardedTensor, ShardedTensorFactory, is_main_replica,
)
from minitron.core.dist_checkpointing.serialization import load, save  # noqa: F401
