"""What a trace directory says a run cost, and two runs side by side (`minitron diff A B`).

A traced run records every torch.distributed call with its group and tensor shape; summed per
group kind (the keys of `minitron groups --json`) those records are the run's communication,
which `minitron estimate --check` sets beside the prediction and `minitron diff` beside
another run: groups created, calls and bytes per kind, time per phase, and the calls one run
makes that the other does not.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from rich.table import Table

from minitron.cli.views.trace_dir import INIT_MP, TRAIN_STEP, layout_args, world_size_of
from minitron.core.rank_generator import DESC_TO_KEY

DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4,
               "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
DIST = "torch.distributed."
SETUP = {DIST + "new_group", DIST + "init_process_group", DIST + "destroy_process_group"}
SET_GLOBALS = "minitron.training.global_vars.set_global_variables"
# Phases of a run, by the traced step that contains a call (the first match, outermost last).
PHASES = (("train_step", TRAIN_STEP), ("model and optimizer", "minitron.training.model_setup.setup_model_and_optimizer"),
          ("data", "minitron.training.data.build_train_valid_test_data_iterators"),
          ("initialize", "minitron.training.initialize.initialize_megatron"))


def group_key(args: dict) -> str:
    desc = args.get("group", "WORLD")
    return "world" if desc == "WORLD" else DESC_TO_KEY.get(desc, desc)


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def call_bytes(record: dict, pipeline_dtype: str = "float32") -> int:
    """Bytes a rank hands to one call: the tensor it passes (the input of a gather or scatter
    into a flat tensor); of a batch of point-to-point ops, the ones it sends."""
    args = record["args"]
    if "ops" in args:
        return sum(numel(op["shape"]) * DTYPE_BYTES[op.get("dtype", pipeline_dtype)]
                   for op in args["ops"] if op["op"] == "isend")
    shape = args.get("shape")
    if not isinstance(shape, list) or (shape and isinstance(shape[0], list)):
        return 0   # barrier; a list of tensors (not used on minitron's paths)
    return numel(shape) * DTYPE_BYTES.get(args.get("dtype", "float32"), 4)


def inside(records: list[dict], name: str) -> list[dict]:
    """The records that ran inside a call named ``name`` (by the parent chain)."""
    by_id = {r["id"]: r for r in records}
    memo: dict[int, bool] = {}

    def under(record) -> bool:
        chain, found = [], False
        while record is not None:
            if record["id"] in memo:
                found = memo[record["id"]]
                break
            chain.append(record["id"])
            if record["name"] == name:
                found = True
                break
            record = by_id.get(record["parent"])
        for i in chain:
            memo[i] = found
        return found

    return [r for r in records if r["name"] != name and under(r)]


def recorded_args(runs: dict[int, list[dict]]) -> dict | None:
    """The validated arguments the ranks ran with (set_global_variables records them)."""
    for records in runs.values():
        for r in records:
            if r["name"] == SET_GLOBALS and isinstance(r["args"].get("args"), dict):
                return r["args"]["args"]
    return None


def comm_by_key(records: list[dict], pipeline_dtype: str = "float32", within: str = TRAIN_STEP) -> dict:
    """group key -> [bytes, calls] of the collectives and sends inside ``within`` calls."""
    tally: dict[str, list[int]] = {}
    for r in inside(records, within):
        if r["name"].startswith(DIST) and r["name"] not in SETUP:
            entry = tally.setdefault(group_key(r["args"]), [0, 0])
            entry[0] += call_bytes(r, pipeline_dtype)
            entry[1] += 1
    return tally
