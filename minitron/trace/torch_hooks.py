"""Wrap torch.distributed's entry points while tracing is on.

Megatron and minitron call ``torch.distributed.all_reduce(...)`` through the module attribute,
so replacing the attribute is enough to see every call they make. torch's own internals call
the functions in ``distributed_c10d`` directly and stay untouched, so the trace shows what the
program asked for, not torch's bookkeeping.

Every one of them may wait for other ranks, so each is recorded as it begins too (the
recorder's ``blocking`` span): a hung job's trace shows what each rank was waiting in.

Each record names the group the call ran on: its ranks and its description (the
``group_desc`` Megatron passes to new_group, e.g. ``TENSOR_MODEL_PARALLEL_GROUP``).
"""

from __future__ import annotations

import functools

import torch.distributed as dist

from minitron.trace import recorder as _rec
from minitron.trace.group_ranks import compact_ranks

# isend/irecv stay unwrapped: torch.distributed.P2POp accepts only torch's own two functions
# (it checks their identity). Pipeline traffic is recorded where it is posted, at
# batch_isend_irecv, with every op's direction, peer and shape.
# all_gather_single / reduce_scatter_single are torch 2.13's names for the one-tensor gather and
# reduce-scatter (all_gather_into_tensor and reduce_scatter_tensor now call them inside c10d,
# unwrapped, so nothing is counted twice); torch's own FSDP2 calls them by these names.
SINGLE_TENSOR = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_gather_single", "reduce_scatter_single")
COLLECTIVES = (
    "all_reduce", "all_gather", "reduce_scatter", *SINGLE_TENSOR,
    "broadcast", "reduce", "all_to_all_single", "gather", "scatter", "barrier",
    "send", "recv", "batch_isend_irecv",
)
SETUP = ("init_process_group", "new_group", "destroy_process_group")

_ORIGINAL: dict[str, object] = {}                 # name -> torch's function, while installed
_MADE: dict[str, tuple[object, object]] = {}     # name -> (the function wrapped, its wrapper)


def describe_group(group) -> dict:
    """{'group': 'TENSOR_MODEL_PARALLEL_GROUP', 'ranks': [0, 1]} for a ProcessGroup (None = world)."""
    if group is None or group is dist.GroupMember.WORLD:
        return {"group": "WORLD", "ranks": "all"}
    try:
        ranks = dist.get_process_group_ranks(group)
    except Exception:  # a group this rank is not in
        return {"group": "non-member"}
    desc = getattr(group, "group_desc", "") or "undescribed"
    return {"group": desc, "ranks": ranks if len(ranks) <= 64 else f"{len(ranks)} ranks"}


def _collective_args(name: str, args: tuple, kwargs: dict) -> dict:
    record = {}
    tensor = kwargs.get("tensor", args[0] if args else None)
    if name in SINGLE_TENSOR:   # record what this rank hands in (FSDP2 passes it by keyword)
        tensor = kwargs.get("input_tensor", kwargs.get("input", args[1] if len(args) > 1 else None))
    if name == "batch_isend_irecv":
        ops = args[0] if args else kwargs.get("p2p_op_list", [])
        record["ops"] = [
            {"op": op.op.__name__, "peer": op.peer, "shape": list(op.tensor.shape),
             "dtype": str(op.tensor.dtype).replace("torch.", "")} for op in ops
        ]
        group = ops[0].group if ops else None
    else:
        group = kwargs.get("group")
        if group is None and name not in ("barrier", "batch_isend_irecv"):
            group = _positional_group(name, args)
    if name == "all_to_all_single":   # shape is what arrives; say what leaves, and the blocks
        source = kwargs.get("input", args[1] if len(args) > 1 else None)
        record["input_shape"] = list(source.shape) if hasattr(source, "shape") else None
        for key in ("output_split_sizes", "input_split_sizes"):
            if kwargs.get(key) is not None:
                record[key] = list(kwargs[key])
    if hasattr(tensor, "shape"):
        record["shape"] = list(tensor.shape)
        record["dtype"] = str(tensor.dtype).replace("torch.", "")
    elif isinstance(tensor, list) and tensor and hasattr(tensor[0], "shape"):
        record["shape"] = [list(t.shape) for t in tensor[:4]]
        record["dtype"] = str(tensor[0].dtype).replace("torch.", "")   # (all_gather's list: one dtype)
    for key in ("src", "dst", "op", "group_src", "group_dst"):
        if key in kwargs and kwargs[key] is not None:
            record[key] = str(kwargs[key]) if key == "op" else kwargs[key]
    if name in ("send", "isend", "recv", "irecv", "broadcast", "reduce") and len(args) > 1:
        record.setdefault("dst" if name in ("send", "isend", "reduce") else "src", args[1])
    if kwargs.get("async_op"):   # returns at once; the caller waits on the handle later
        record["async_op"] = True
    record.update(describe_group(group))
    return record


def _positional_group(name: str, args: tuple):
    # Where each collective takes `group` positionally, counting from 0.
    where = {"all_reduce": 2, "broadcast": 2, "all_gather": 2, "all_gather_into_tensor": 2,
             "all_gather_single": 2, "reduce_scatter_tensor": 3, "reduce_scatter_single": 3, "reduce_scatter": 3,
             "reduce": 3, "send": 2, "recv": 2, "isend": 2, "irecv": 2}.get(name)
    return args[where] if where is not None and len(args) > where else None


def _wrap_collective(name: str, original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        recorder = _rec._ACTIVE
        if recorder is None:
            return original(*args, **kwargs)
        with recorder.span(f"torch.distributed.{name}", _collective_args(name, args, kwargs), blocking=True):
            return original(*args, **kwargs)
    return wrapper


def _wrap_new_group(original):
    @functools.wraps(original)
    def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
                  use_local_synchronization=False, group_desc=None, **kwargs):
        recorder = _rec._ACTIVE
        call = lambda: original(ranks, timeout, backend, pg_options, use_local_synchronization,
                                group_desc, **kwargs)
        if recorder is None:
            return call()
        member = ranks is None or recorder.rank in ranks
        args = {"ranks": compact_ranks(list(ranks)) if ranks is not None else "all",   # bounded: group_ranks.py
                "group_desc": group_desc, "backend": backend or "default", "member": member}
        with recorder.span("torch.distributed.new_group", args, blocking=True):
            return call()
    return new_group


def _wrap_init(original):
    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        recorder = _rec._ACTIVE
        if recorder is None:
            return original(*args, **kwargs)
        info = {k: _rec.short_value(v) for k, v in kwargs.items() if k not in ("store", "pg_options")}
        if args:
            info["backend"] = args[0]
        with recorder.span("torch.distributed.init_process_group", info, blocking=True):
            return original(*args, **kwargs)
    return init_process_group


def _wrap_plain(name: str, original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        recorder = _rec._ACTIVE
        if recorder is None:
            return original(*args, **kwargs)
        with recorder.span(f"torch.distributed.{name}", {}, blocking=True):
            return original(*args, **kwargs)
    return wrapper


def install() -> None:
    """Replace the module attributes (once; a second call is a no-op)."""
    if _ORIGINAL:
        return
    for name in COLLECTIVES + SETUP:
        original = getattr(dist, name, None)
        if original is None:
            continue
        _ORIGINAL[name] = original
        setattr(dist, name, _wrapper(name, original))


def _wrapper(name: str, original):
    """The wrapper of ``original``, made once: a fake world starts tracing a thousand times."""
    made = _MADE.get(name)
    if made is None or made[0] is not original:
        if name == "new_group":
            wrapped = _wrap_new_group(original)
        elif name == "init_process_group":
            wrapped = _wrap_init(original)
        elif name == "destroy_process_group":
            wrapped = _wrap_plain(name, original)
        else:
            wrapped = _wrap_collective(name, original)
        made = _MADE[name] = (original, wrapped)
    return made[1]


def uninstall() -> None:
    for name, original in _ORIGINAL.items():
        setattr(dist, name, original)
    _ORIGINAL.clear()
