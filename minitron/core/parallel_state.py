"""Model- and data-parallel process groups, and the getters the rest of the code asks.

``initialize_model_parallel`` runs on every rank with the same sizes. It walks each kind of
group and calls ``torch.distributed.new_group`` for *every* group of that kind, including the
ones this rank is not in: new_group is collective over the whole world, so all ranks must make
the same calls in the same order (a rank that skips one deadlocks or mismatches the others).
Each rank keeps the one group of each kind that contains it.

The rank arithmetic lives in rank_generator.py; this file is the stateful half.
"""

from __future__ import annotations

from datetime import timedelta

import torch

from minitron.comm.timer_slack import release_together
from minitron.core.rank_generator import DEFAULT_ORDER, HIERARCHICAL_CP_DESC, generators, validate_parallel_sizes
from minitron.core.group_layout import all_groups, hierarchical_group_ranks
from minitron.core.utils import GlobalMemoryBuffer
from minitron.trace import traced

# One module-level slot per group kind: the group this rank belongs to, and its global ranks.
# Megatron keeps ~40 separate globals; a dict keyed by the layout's short names says the same
# and lets a reader print them all at once.
_GROUP: dict[str, object] = {}
_GLOBAL_RANKS: dict[str, list[int]] = {}

_VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK = None
_VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE = None
_RANK = None  # this process's global rank, read once: it is asked thousands of times below
_GLOBAL_MEMORY_BUFFER: GlobalMemoryBuffer | None = None  # scratch the sequence-parallel linears borrow


def create_group(ranks, timeout=None, backend=None, group_desc=None):
    """new_group with Megatron's description; every rank calls it for every group."""
    return torch.distributed.new_group(ranks, timeout=timeout, backend=backend, group_desc=group_desc)


def _keep(key: str, ranks, group) -> None:
    """Remember ``group`` as this rank's ``key`` group (this rank is one of ``ranks``)."""
    _GROUP[key] = group
    _GLOBAL_RANKS[key] = list(ranks)


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
    if _GROUP:
        raise RuntimeError("model parallel groups are already initialized; destroy them first")
    global _RANK, _VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK, _VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE
    _RANK = torch.distributed.get_rank()
    tp, pp, vp = tensor_model_parallel_size, pipeline_model_parallel_size, virtual_pipeline_model_parallel_size
    world_size = torch.distributed.get_world_size()
    validate_parallel_sizes(world_size, tp, pp, context_parallel_size, expert_model_parallel_size,
                            expert_tensor_parallel_size, vp, order)
    dense, expert = generators(world_size, tp, pp, context_parallel_size, expert_model_parallel_size,
                               order, expert_tensor_parallel_size)
    if vp is not None:
        _VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK = 0
        _VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE = vp
    timeout = timedelta(minutes=distributed_timeout_minutes)

    # GROUP_KINDS (rank_generator.py) lists the kinds in Megatron's order; all_groups walks it.
    for kind, groups in all_groups(dense, expert):
        key, desc, gloo = kind.key, kind.desc, kind.gloo
        for ranks in groups:
            group = create_group(ranks, timeout=timeout, group_desc=desc)
            mine = _RANK in ranks  # asked once: at world 1024 a rank walks ~3,400 groups
            if mine:
                _keep(key, ranks, group)
            if key == "cp" and hierarchical_context_parallel_sizes:   # --cp-comm-type a2a+p2p's levels
                _create_hierarchical_groups(ranks, hierarchical_context_parallel_sizes, timeout)
            if gloo:
                # CPU-side collectives (checkpoint metadata, the distributed optimizer's state
                # gathering) run on a gloo group even when the main groups are NCCL.
                twin = create_group(ranks, timeout=timeout, backend="gloo", group_desc=desc + "_GLOO")
                if mine:
                    _keep(key + "-gloo", ranks, twin)

    # Last, as in Megatron: the scratch memory the layers borrow (tensor_parallel/layers.py).
    _set_global_memory_buffer()


def is_initialized() -> bool:
    return "dp" in _GROUP


model_parallel_is_initialized = is_initialized


def get_group(key: str):
    """This rank's group of kind ``key`` ('tp', 'dp-cp', 'embd', ...)."""
    if key not in _GROUP:
        raise RuntimeError(f"this rank has no {key!r} group: is initialize_model_parallel done?")
    return _GROUP[key]


def get_global_ranks(key: str) -> list[int]:
    return _GLOBAL_RANKS[key]


# Megatron's getter names, as thin views over the two dicts above. ------------------------
def get_tensor_model_parallel_group():
    return get_group("tp")


def get_pipeline_model_parallel_group():
    return get_group("pp")


def get_model_parallel_group():
    return get_group("tp-pp")


def get_context_parallel_group():
    return get_group("cp")


def get_data_parallel_group(with_context_parallel: bool = False):
    return get_group("dp-cp" if with_context_parallel else "dp")


def get_data_parallel_group_gloo(with_context_parallel: bool = False):
    return get_group("dp-cp-gloo" if with_context_parallel else "dp-gloo")


def get_embedding_group():
    return get_group("embd")


def get_position_embedding_group():
    return get_group("pos-embd")


def get_tensor_and_data_parallel_group(with_context_parallel: bool = False):
    return get_group("tp-dp-cp" if with_context_parallel else "tp-dp")


def get_tensor_and_context_parallel_group():
    return get_group("tp-cp")


def get_expert_model_parallel_group():
    return get_group("ep")


def get_expert_tensor_parallel_group():
    return get_group("expt-tp")


def get_expert_tensor_and_model_parallel_group():
    return get_group("tp-ep")


def get_expert_data_parallel_group():
    return get_group("expt-dp")


def _size(key: str) -> int:
    return len(_GLOBAL_RANKS[key])


def _rank_in(key: str) -> int:
    return _GLOBAL_RANKS[key].index(torch.distributed.get_rank())


def get_tensor_model_parallel_world_size() -> int:
    return _size("tp")


def get_pipeline_model_parallel_world_size() -> int:
    return _size("pp")


def get_data_parallel_world_size(with_context_parallel: bool = False) -> int:
    return _size("dp-cp" if with_context_parallel else "dp")


def get_context_parallel_world_size() -> int:
    return _size("cp")


def get_expert_model_parallel_world_size() -> int:
    return _size("ep")


def get_tensor_model_parallel_rank() -> int:
    return _rank_in("tp")


def get_pipeline_model_parallel_rank() -> int:
    return _rank_in("pp")


def get_data_parallel_rank(with_context_parallel: bool = False) -> int:
    return _rank_in("dp-cp" if with_context_parallel else "dp")


def get_context_parallel_rank() -> int:
    return _rank_in("cp")


def get_expert_model_parallel_rank() -> int:
    return _rank_in("ep")


def get_tensor_model_parallel_src_rank() -> int:
    """Global rank of tensor-parallel rank 0 in my group: the one that reads data and broadcasts."""
    return _GLOBAL_RANKS["tp"][0]


def get_data_parallel_src_rank(with_context_parallel: bool = False) -> int:
    return _GLOBAL_RANKS["dp-cp" if with_context_parallel else "dp"][0]


def get_pipeline_model_parallel_first_rank() -> int:
    return _GLOBAL_RANKS["pp"][0]


def get_pipeline_model_parallel_last_rank() -> int:
    return _GLOBAL_RANKS["pp"][-1]


def get_pipeline_model_parallel_next_rank() -> int:
    """The stage after mine (wrapping around: the interleaved schedule sends last -> first)."""
    ranks = _GLOBAL_RANKS["pp"]
    return ranks[(_rank_in("pp") + 1) % len(ranks)]


def get_pipeline_model_parallel_prev_rank() -> int:
    ranks = _GLOBAL_RANKS["pp"]
    return ranks[(_rank_in("pp") - 1) % len(ranks)]


def get_virtual_pipeline_model_parallel_rank():
    return _VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK


def set_virtual_pipeline_model_parallel_rank(rank: int) -> None:
    global _VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK
    _VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK = rank


def get_virtual_pipeline_model_parallel_world_size():
    return _VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE


# Which stage am I? ------------------------------------------------------------------------
# With a virtual pipeline a rank holds several model chunks, and "first stage" can mean the
# first pipeline rank (ignore_virtual=True) or its chunk 0 only (ignore_virtual=False, and
# then the caller names its chunk: vp_stage). Megatron defaulted to ignore_virtual=False and
# read a global "current chunk" until core_v0.12; it now defaults to True and takes vp_stage,
# so a caller that means one chunk says which. We follow the current form.
def _check_vp_stage(vp_stage) -> None:
    if vp_stage is None:
        raise ValueError("with a virtual pipeline, ignore_virtual=False needs vp_stage (the model "
                         "chunk asked about); pass vp_stage=..., or ignore_virtual=True for the rank")


def is_pipeline_first_stage(ignore_virtual: bool = True, vp_stage: int | None = None) -> bool:
    """First stage: pipeline rank 0 and, unless ignore_virtual, model chunk 0."""
    if not ignore_virtual and _VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE is not None:
        _check_vp_stage(vp_stage)
        if vp_stage != 0:
            return False
    return get_pipeline_model_parallel_rank() == 0


def is_pipeline_last_stage(ignore_virtual: bool = True, vp_stage: int | None = None) -> bool:
    """Last stage: the last pipeline rank and, unless ignore_virtual, its last model chunk."""
    vp = _VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE
    if not ignore_virtual and vp is not None:
        _check_vp_stage(vp_stage)
        if vp_stage != vp - 1:
            return False
    return get_pipeline_model_parallel_rank() == get_pipeline_model_parallel_world_size() - 1


def is_rank_in_embedding_group(ignore_virtual: bool = True, vp_stage: int | None = None) -> bool:
    """Does this rank (or, unless ignore_virtual, its chunk vp_stage) hold a copy of the word
    embedding: the input embedding of the first stage or the output layer of the last?"""
    rank = torch.distributed.get_rank()
    ranks = _GLOBAL_RANKS.get("embd", [])
    if ignore_virtual:
        return rank in ranks
    if rank not in ranks:
        return False
    if rank == ranks[0]:
        return is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
    if rank == ranks[-1]:
        return is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    return True


def is_rank_in_position_embedding_group() -> bool:
    return torch.distributed.get_rank() in _GLOBAL_RANKS.get("pos-embd", [])


def _create_hierarchical_groups(ranks, sizes, timeout) -> None:
    """Right after each context-parallel group, as Megatron does, its sub-groups level by level
    (rank_generator.hierarchical_group_ranks)."""
    for level, subgroups in enumerate(hierarchical_group_ranks(ranks, sizes)):
        for sub in subgroups:
            group = create_group(sub, timeout=timeout, group_desc=HIERARCHICAL_CP_DESC)
            if _RANK in sub:
                _keep(f"hcp-{level}", sub, group)


def get_hierarchical_context_parallel_groups() -> list:
    """This rank's context-parallel sub-group at each level (a2a+p2p: [a2a group, p2p group])."""
    return [_GROUP[key] for key in sorted(key for key in _GROUP if key.startswith("hcp-"))]


def destroy_model_parallel() -> None:
    """Forget every group (and destroy them in torch), so initialize can run again."""
    global _VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK, _VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE, _RANK
    groups = list({id(g): g for g in _GROUP.values()}.values())  # a group may serve two keys
    _GROUP.clear()
    gloo = []  # gloo groups end when their transport threads next wake: all at once (release_together)
    if torch.distributed.is_initialized():
        gloo = [g for g in groups if torch.distributed.get_backend(g) == "gloo"]
        while groups:  # popped: once destroyed, a group is held by `gloo` alone, or by nothing
            torch.distributed.destroy_process_group(groups.pop())
    groups.clear()  # torch was already shut down: they end here, as before
    release_together(gloo)
    _RANK = None
    _GLOBAL_RANKS.clear()
    _VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK = None
    _VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE = None
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
