"""minitron.comm: DeepSpeed's comm layer in miniature (init_distributed, cdb, TorchBackend), and
its module-level API, through which the runtime (``from minitron import comm as dist``) makes
every collective call, as DeepSpeed's does through ``deepspeed.comm``."""

from minitron.comm.comm import (
    ReduceOp, all_gather, all_gather_into_tensor, all_reduce, all_to_all_single, barrier, broadcast, configure,
    destroy_process_group, get_global_rank, get_rank, get_world_group, get_world_size,
    init_distributed, is_initialized, log_summary, new_group, recv, reduce, reduce_scatter_tensor, send,
)
from minitron.comm.utils import WorldInfo, discover_world_info

__all__ = [
    "ReduceOp", "WorldInfo", "all_gather", "all_gather_into_tensor", "all_reduce", "all_to_all_single", "barrier", "broadcast",
    "configure", "destroy_process_group", "discover_world_info", "get_global_rank", "get_rank", "get_world_group",
    "get_world_size", "init_distributed", "is_initialized", "log_summary", "new_group", "recv", "reduce", "reduce_scatter_tensor",
    "send",
]
