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

from minitron.trace.reader import TRAIN_STEP, layout_args, world_size_of
from minitron.trace.schema import DIST
from minitron.cli.views.words import duration, human, short_name
from minitron.core.rank_generator import DESC_TO_KEY
from minitron.training.theoretical_params import DTYPE_BYTES   # the one table: estimate and trace agree

SETUP = {DIST + "new_group", DIST + "init_process_group", DIST + "destroy_process_group"}
SET_GLOBALS = "minitron.training.global_vars.set_global_variables"
# Phases of a run, by the traced step that contains a call (the first match, outermost last).
PHASES = (("train_step", TRAIN_STEP), ("model and optimizer", "minitron.training.model_setup.setup_model_and_optimizer"),
          ("data", "minitron.training.data.build_train_valid_test_data_iterators"),
          ("initialize", "minitron.training.initialize.initialize_megatron"))


def desc_key(desc: str) -> str:
    """Megatron's group_desc -> our key; a gloo twin ("..._GLOO") is the key + " gloo"."""
    if desc.endswith("_GLOO") and desc[:-5] in DESC_TO_KEY:
        return DESC_TO_KEY[desc[:-5]] + " gloo"
    return DESC_TO_KEY.get(desc, desc)


def group_key(args: dict) -> str:
    desc = args.get("group", "WORLD")
    return "world" if desc == "WORLD" else desc_key(desc)


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
        return sum(numel(op["shape"]) * DTYPE_BYTES.get(op.get("dtype", pipeline_dtype), 4)
                   for op in args["ops"] if op["op"] == "isend")
    shape = args.get("input_shape", args.get("shape"))   # all_to_all_single: what leaves
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


# --- two runs side by side -------------------------------------------------------------------
def call_label(record: dict) -> str:
    """A call's name; a torch.distributed call also names its group kind ("all_reduce @ tp")."""
    name = record["name"]
    if name.startswith(DIST) and name not in SETUP:
        return f"{name[len(DIST):]} @ {group_key(record['args'])}"
    return name


def summarize(runs: dict[int, list[dict]]) -> dict:
    """What diff compares, for one run: its layout line, groups created by kind, collectives by
    kind (all ranks, inside train_step), slowest rank's time per phase, and call labels."""
    first = next(iter(runs.values()))
    args = recorded_args(runs) or {}
    sizes = layout_args(first) or {}
    groups: dict[str, set] = defaultdict(set)
    calls: Counter = Counter()
    comm: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    phases: dict[str, float] = {}
    dtype = args.get("params_dtype", "float32")
    for records in runs.values():
        for r in records:
            if r["name"] == DIST + "new_group" and r["args"].get("member", True):
                ranks = r["args"].get("ranks")
                groups[desc_key(r["args"].get("group_desc") or "?")].add(
                    tuple(ranks) if isinstance(ranks, list) else str(ranks))
            calls[call_label(r)] += 1
        for key, (nbytes, n) in comm_by_key(records, dtype).items():
            comm[key][0] += nbytes
            comm[key][1] += n
        for phase, name in PHASES:
            spent = sum(r["end_us"] - r["start_us"] for r in records if r["name"] == name)
            if spent:
                phases[phase] = max(phases.get(phase, 0), spent)
    layout = {k: sizes.get(k) for k in ("tp", "pp", "cp", "ep")}
    layout["dp"] = args.get("data_parallel_size")
    layout["vp"] = args.get("virtual_pipeline_model_parallel_size")
    return {"world": world_size_of(runs), "layout": layout, "groups": dict(groups), "comm": dict(comm),
            "phases": phases, "calls": calls, "steps": sum(1 for records in runs.values() for r in records
                                                            if r["name"] == TRAIN_STEP)}


def layout_line(summary: dict) -> str:
    parts = [f"{k} {v}" for k, v in summary["layout"].items() if v not in (None, 1) or k in ("tp", "pp", "dp")]
    return f"{summary['world']} ranks: " + " × ".join(p for p in parts if not p.endswith("None"))


def diff_tables(a: dict, b: dict, name_a: str, name_b: str) -> list:
    """The rich renderables of `minitron diff`, in reading order."""
    out = []
    groups = Table(title="groups created (distinct groups, all ranks)", title_style="bold")
    for col in ("kind", name_a, name_b):
        groups.add_column(col, justify="left" if col == "kind" else "right", no_wrap=True)
    for key in dict.fromkeys([*a["groups"], *b["groups"]]):
        cells = []
        for s in (a, b):
            found = s["groups"].get(key, set())
            sizes = sorted({len(g) for g in found if isinstance(g, tuple)})
            cells.append(f"{len(found)} × {'/'.join(map(str, sizes))}" if found else "-")
        groups.add_row(key, *cells, style=None if cells[0] == cells[1] else "bold")
    out.append(groups)

    comm = Table(title="collectives and sends in train_step, all ranks (calls, bytes)", title_style="bold")
    for col in ("kind", f"{name_a} calls", "bytes", f"{name_b} calls", "bytes "):
        comm.add_column(col, justify="left" if col == "kind" else "right", no_wrap=True)
    for key in dict.fromkeys([*a["comm"], *b["comm"]]):
        ca, cb = a["comm"].get(key, [0, 0]), b["comm"].get(key, [0, 0])
        comm.add_row(key, str(ca[1]) if ca[1] else "-", human(ca[0]) if ca[1] else "-",
                     str(cb[1]) if cb[1] else "-", human(cb[0]) if cb[1] else "-")
    total_a, total_b = (sum(v[0] for v in s["comm"].values()) for s in (a, b))
    comm.add_row("all", "", human(total_a), "", human(total_b), style="bold")
    out.append(comm)

    phases = Table(title="time per phase (slowest rank)", title_style="bold")
    for col in ("phase", name_a, name_b):
        phases.add_column(col, justify="left" if col == "phase" else "right", no_wrap=True)
    for phase, _ in reversed(PHASES):
        if phase in a["phases"] or phase in b["phases"]:
            phases.add_row(phase, *[duration(s["phases"][phase]) if phase in s["phases"] else "-" for s in (a, b)])
    out.append(phases)

    def shown(label: str) -> str:
        return label if " @ " in label else short_name(label)

    only = Table(title="calls made in one run only (how many, all ranks)", title_style="bold")
    for col in ("call", name_a, name_b):
        only.add_column(col, justify="left" if col == "call" else "right", no_wrap=True)
    labels = sorted(set(a["calls"]) ^ set(b["calls"]))
    for label in labels:
        only.add_row(shown(label), str(a["calls"].get(label, "-")), str(b["calls"].get(label, "-")))
    out.append(only if only.row_count else "every call (name and group kind) appears in both runs")
    both = [label for label in a["calls"] if label in b["calls"] and a["calls"][label] != b["calls"][label]]
    both.sort(key=lambda label: -abs(a["calls"][label] - b["calls"][label]))
    if both:
        more = Table(title="calls made in both, a different number of times (largest differences)", title_style="bold")
        for col in ("call", name_a, name_b):
            more.add_column(col, justify="left" if col == "call" else "right", no_wrap=True)
        for label in both[:8]:
            more.add_row(shown(label), str(a["calls"][label]), str(b["calls"][label]))
        out.append(more)
    return out
