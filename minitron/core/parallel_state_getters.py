"""The groups this rank kept, and Megatron's getters over them.

initialize_model_parallel (parallel_state.py) creates every group of the world and hands this
module the ones that hold this rank (``keep_group``); everything after initialization only
asks: which group, how many ranks, which rank am I, which pipeline stage. Megatron keeps the
getters in parallel_state.py beside the initializer; they are a file of their own here so that
the initializer reads in one sitting, and parallel_state re-exports every name, so callers
keep writing ``parallel_state.get_tensor_model_parallel_rank()`` as in Megatron.
"""

from __future__ import annotations

import torch

# One module-level slot per group kind: the group this rank belongs to, and its global ranks.
# Megatron keeps ~40 separate globals; a dict keyed by the layout's short names says the same
# and lets a reader print them all at once.
_GROUP: dict[str, object] = {}
_GLOBAL_RANKS: dict[str, list[int]] = {}

_VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK = None
_VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE = None


def keep_group(key: str, ranks, group) -> None:
    """Remember ``group`` as this rank's ``key`` group (this rank is one of ``ranks``)."""
    _GROUP[key] = group
    _GLOBAL_RANKS[key] = list(ranks)


def forget_groups() -> list:
    """Forget every kept group and the virtual pipeline; return the groups, each once (a group
    may serve two keys), for destroy_model_parallel to hand back to torch."""
    global _VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK, _VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE
    groups = list({id(g): g for g in _GROUP.values()}.values())
    _GROUP.clear()
    _GLOBAL_RANKS.clear()
    _VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK = None
    _VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE = None
    return groups


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


def set_virtual_pipeline_model_parallel_world_size(world_size) -> None:
    """How many model chunks each pipeline rank holds (None: no virtual pipeline)."""
    global _VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE
    _VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE = world_size


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


def get_hierarchical_context_parallel_groups() -> list:
    """This rank's context-parallel sub-group at each level (a2a+p2p: [a2a group, p2p group])."""
    return [_GROUP[key] for key in sorted(key for key in _GROUP if key.startswith("hcp-"))]

