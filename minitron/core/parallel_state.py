"""Model- and data-parallel process groups, and the getters the rest of the code asks.

``initialize_model_parallel`` runs on every rank with the same sizes. It walks each kind of
group and calls ``torch.distributed.new_group`` for *every* group of that kind, including the
ones this rank is not in: new_group is collective over the whole world, so all ranks must make
the same calls in the same order (a rank that skips one deadlocks or mismatches the others).
Each rank keeps the one group of each kind that contains it.

The rank arithmetic lives in rank_generator.py and group_layout.py; the groups this rank kept,
and Megatron's getters over them, in parallel_state_getters.py (every name re-exported here).
This file creates and destroys them.
"""

from __future__ import annotations

from datetime import timedelta

import torch

from minitron.comm.timer_slack import release_together
from minitron.core.rank_generator import DEFAULT_ORDER, HIERARCHICAL_CP_DESC, generators, validate_parallel_sizes
from minitron.core.group_layout import all_groups, hierarchical_group_ranks
from minitron.core.parallel_state_getters import forget_groups, is_initialized, keep_group
from minitron.core.utils import GlobalMemoryBuffer
from minitron.trace import traced

# Megatron's getters live in its parallel_state; ours in parallel_state_getters, named here too so
# that every caller asks parallel_state as it does in Megatron.
from minitron.core.parallel_state_getters import (  # noqa: F401  (re-exported)
    model_parallel_is_initialized, get_group, get_global_ranks, get_tensor_model_parallel_group, get_pipeline_model_parallel_group,
    get_model_parallel_group, get_context_parallel_group, get_data_parallel_group,
    get_data_parallel_group_gloo, get_embedding_group, get_position_embedding_group,
    get_tensor_and_data_parallel_group, get_tensor_and_context_parallel_group,
    get_expert_model_parallel_group, get_expert_tensor_parallel_group,
    get_expert_tensor_and_model_parallel_group, get_expert_data_parallel_group,
    get_tensor_model_parallel_world_size, get_pipeline_model_parallel_world_size,
    get_data_parallel_world_size, get_context_parallel_world_size,
    get_expert_model_parallel_world_size, get_tensor_model_parallel_rank,
    get_pipeline_model_parallel_rank, get_data_parallel_rank, get_context_parallel_rank,
    get_expert_model_parallel_rank, get_tensor_model_parallel_src_rank, get_data_parallel_src_rank,
    get_pipeline_model_parallel_first_rank, get_pipeline_model_parallel_last_rank,
    get_pipeline_model_parallel_next_rank, get_pipeline_model_parallel_prev_rank,
    get_virtual_pipeline_model_parallel_rank, set_virtual_pipeline_model_parallel_rank,
    set_virtual_pipeline_model_parallel_world_size, get_virtual_pipeline_model_parallel_world_size,
    is_pipeline_first_stage, is_pipeline_last_stage, is_rank_in_embedding_group,
    is_rank_in_position_embedding_group, get_hierarchical_context_parallel_groups,
)

_RANK = None  # this process's global rank, read once: it is asked thousands of times below
_GLOBAL_MEMORY_BUFFER: GlobalMemoryBuffer | None = None  # scratch the sequence-parallel linears borrow


def create_group(ranks, timeout=None, backend=None, group_desc=None):
    """new_group with Megatron's description; every rank calls it for every group."""
    return torch.distributed.new_group(ranks, timeout=timeout, backend=backend, group_desc=group_desc)


@traced
def initialize_model_parallel(
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    virtual_pipeline_model_parallel_size: int | None = None,
    context_parallel_size: int = 1,
    expert_model_parallel_size: int = 1,
    expert_tensor_parallel_size: int | None = None,
    distributed_timeout_minutes: int = 30,
    order: str = DEFAULT_ORDER,
    hierarchical_context_parallel_sizes: list[int] | None = None,
) -> None:
    """Create every group, in Megatron's order, and keep this rank's.

    Example (Megatron's docstring): 16 ranks, tp=2, pp=4 -> dp=2, and
      8 tensor groups   [0,1] [2,3] ... [14,15]
      8 data groups     [0,2] [1,3] [4,6] [5,7] ...
      4 pipeline groups [0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15]
    """
    assert torch.distributed.is_initialized(), "call torch.distributed.init_process_group first"
    if is_initialized():
        raise RuntimeError("model parallel groups are already initialized; destroy them first")
    global _RANK
    _RANK = torch.distributed.get_rank()
    tp, pp, vp = tensor_model_parallel_size, pipeline_model_parallel_size, virtual_pipeline_model_parallel_size
    world_size = torch.distributed.get_world_size()
    validate_parallel_sizes(world_size, tp, pp, context_parallel_size, expert_model_parallel_size,
                            expert_tensor_parallel_size, vp, order)
    dense, expert = generators(world_size, tp, pp, context_parallel_size, expert_model_parallel_size,
                               order, expert_tensor_parallel_size)
    if vp is not None:
        set_virtual_pipeline_model_parallel_rank(0)
        set_virtual_pipeline_model_parallel_world_size(vp)
    timeout = timedelta(minutes=distributed_timeout_minutes)

    # GROUP_KINDS (rank_generator.py) lists the kinds in Megatron's order; all_groups walks it.
    for kind, groups in all_groups(dense, expert):
        key, desc, gloo = kind.key, kind.desc, kind.gloo
        for ranks in groups:
            group = create_group(ranks, timeout=timeout, group_desc=desc)
            mine = _RANK in ranks  # asked once: at world 1024 a rank walks ~3,400 groups
            if mine:
                keep_group(key, ranks, group)
            if key == "cp" and hierarchical_context_parallel_sizes:   # --cp-comm-type a2a+p2p's levels
                _create_hierarchical_groups(ranks, hierarchical_context_parallel_sizes, timeout)
            if gloo:
                # CPU-side collectives (checkpoint metadata, the distributed optimizer's state
                # gathering) run on a gloo group even when the main groups are NCCL.
                twin = create_group(ranks, timeout=timeout, backend="gloo", group_desc=desc + "_GLOO")
                if mine:
                    keep_group(key + "-gloo", ranks, twin)

    # Last, as in Megatron: the scratch memory the layers borrow (tensor_parallel/layers.py).
    _set_global_memory_buffer()


def _create_hierarchical_groups(ranks, sizes, timeout) -> None:
    """Right after each context-parallel group, as Megatron does, its sub-groups level by level
    (group_layout.hierarchical_group_ranks)."""
    for level, subgroups in enumerate(hierarchical_group_ranks(ranks, sizes)):
        for sub in subgroups:
            group = create_group(sub, timeout=timeout, group_desc=HIERARCHICAL_CP_DESC)
            if _RANK in sub:
                keep_group(f"hcp-{level}", sub, group)


def destroy_model_parallel() -> None:
    """Forget every group (and destroy them in torch), so initialize can run again."""
    global _RANK
    groups = forget_groups()  # each once: a group may serve two keys
    gloo = []  # gloo groups end when their transport threads next wake: all at once (release_together)
    if torch.distributed.is_initialized():
        gloo = [g for g in groups if torch.distributed.get_backend(g) == "gloo"]
        while groups:  # popped: once destroyed, a group is held by `gloo` alone, or by nothing
            torch.distributed.destroy_process_group(groups.pop())
    groups.clear()  # torch was already shut down: they end here, as before
    release_together(gloo)
    _RANK = None
    destroy_global_memory_buffer()


# The global memory buffer ------------------------------------------------------------------
@traced
def _set_global_memory_buffer() -> None:
    """Make the one GlobalMemoryBuffer of this process (it allocates nothing until asked)."""
    global _GLOBAL_MEMORY_BUFFER
    if _GLOBAL_MEMORY_BUFFER is not None:
        raise RuntimeError("the global memory buffer already exists; destroy_model_parallel first")
    _GLOBAL_MEMORY_BUFFER = GlobalMemoryBuffer()


def get_global_memory_buffer() -> GlobalMemoryBuffer:
    if _GLOBAL_MEMORY_BUFFER is None:
        raise RuntimeError("no global memory buffer: is initialize_model_parallel done?")
    return _GLOBAL_MEMORY_BUFFER


def destroy_global_memory_buffer() -> None:
    """Drop the buffer (and, once no view of it is alive, its memory)."""
    global _GLOBAL_MEMORY_BUFFER
    _GLOBAL_MEMORY_BUFFER = None
