"""The notes' journey, executed: what the walkthrough's chapters 1, 4 and 6 run at build time.

    python docs/examples/journey.py chain          # the traced chain from the script's entry
    python docs/examples/journey.py get_model      # model_provider's arguments, the parameter report
    python docs/examples/journey.py microbatches   # forward passes per rank in one iteration
    python docs/examples/journey.py order          # the kinds of group, in creation order
    python docs/examples/journey.py tp-cp          # who holds one micro-batch's tokens
    python docs/examples/journey.py store          # which process hosts the rendezvous store
    python docs/examples/journey.py timing N       # N ranks: fresh interpreters vs forks

(store and timing, appendix A's, are in journey_launch.py: they read no trace.)

The first four run pretrain_gpt (see RUNS) and read its trace; `chain DIR [RANK]`, `providers
DIR`, `microbatches DIR` and `order DIR` read a trace directory written by `minitron trace`,
`minitron launch --trace` or `minitron pretrain --trace` instead.
Every number printed comes from a run made when the command runs.
"""

from __future__ import annotations

import json
import sys
import tempfile
import textwrap
from pathlib import Path


WIDTH = 84  # the pages' content column

# --- reading a trace ----------------------------------------------------------------------
def load(trace_dir, rank: int) -> list[dict]:
    """One rank's records in call order (ids are handed out when a call begins)."""
    lines = (Path(trace_dir) / f"rank{rank}.jsonl").read_text().splitlines()
    return sorted(map(json.loads, lines), key=lambda r: r["id"])


def ranks_in(trace_dir) -> list[int]:
    return sorted(int(p.stem[4:]) for p in Path(trace_dir).glob("rank*.jsonl"))


def short(name: str) -> str:
    """The name a reader of Megatron knows: the function's, or the script's entry block."""
    return "pretrain_gpt.__main__" if name.endswith("pretrain_gpt.__main__") else name.rsplit(".", 1)[-1]


def display(name: str) -> str:
    """``short``, but a method keeps its class and torch's functions their module."""
    if name.startswith("torch."):
        return name
    parts = name.split(".")
    return ".".join(parts[-2:]) if len(parts) > 1 and parts[-2][:1].isupper() else short(name)


def first_calls(records: list[dict], names: list[str]) -> list[dict]:
    """The first call of each of ``names``, in the order the rank made them."""
    seen, found = set(), []
    for record in records:
        name = short(record["name"])
        if name in names and name not in seen:
            seen.add(name)
            found.append(record)
    return found


def group_kinds_in_order(records: list[dict]) -> list[str]:
    kinds = []
    for record in records:
        desc = record["args"].get("group_desc") if short(record["name"]) == "new_group" else None
        if desc and desc not in kinds:
            kinds.append(desc)
    return kinds


# --- runs of pretrain_gpt, traced --------------------------------------------------------
# Each mode below starts its own run: pretrain_gpt on forked gloo ranks, traced, with its
# logs kept, as `minitron launch --world W --trace DIR --log-dir LOGS -m minitron.pretrain_gpt
# -- FLAGS` would start it. In-process, so a build that already has torch loaded pays no
# second import for it.
TINY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "1"]
TRAIN = ["--train-iters", "1", "--mock-data", "--lr", "1e-3", "--eval-iters", "0"]
RUNS = {  # mode: (world, flags)
    "chain": (4, ["--tensor-model-parallel-size", "2", *TINY]),
    "get_model": (4, ["--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2",
                      *TINY, "--global-batch-size", "4", "--bf16", *TRAIN]),
    "microbatches": (4, [*TINY[:-2], "--micro-batch-size", "2", "--global-batch-size", "16", *TRAIN]),
    "order": (8, ["--tensor-model-parallel-size", "2", "--context-parallel-size", "2", *TINY]),
}


def run_pretrain(world: int, flags: list[str], out) -> tuple[Path, dict[int, str]]:
    """Run pretrain_gpt on ``world`` ranks, traced into OUT/trace; (trace dir, {rank: log})."""
    from minitron.launcher import LaunchConfig, Target, launch, session_env

    out = Path(out)
    cfg = LaunchConfig(world_size=world, env=session_env(world, out / "trace"), log_dir=out / "logs")
    launch(cfg, Target(module="minitron.pretrain_gpt", argv=flags))
    return out / "trace", {r: (out / "logs" / f"rank{r}.log").read_text() for r in range(world)}


# set_global_variables gets the whole argument namespace: a hundred entries, most of them for
# later chapters. The page shows the few that this step reads (the micro-batch calculator's
# and the tokenizer's) and counts the rest.
SHOWN_ARGS = ("global_batch_size", "micro_batch_size", "rampup_batch_size", "data_parallel_size",
              "tokenizer_type", "vocab_size")


def _args_text(args: dict) -> str:
    return " ".join(f"{k}={_value_text(v)}" for k, v in args.items() if not isinstance(v, str) or v not in
                    ("Namespace", "dict", "function", "timedelta", "list"))


def _value_text(value) -> str:
    if not isinstance(value, dict) or len(value) <= len(SHOWN_ARGS):
        return str(value)
    shown = ", ".join(f"{k!r}: {value[k]!r}" for k in SHOWN_ARGS if k in value)
    return f"{{{shown}, … {len(value) - sum(k in value for k in SHOWN_ARGS)} more}}"


def chain(trace_dir, rank: int = 0) -> None:
    """Every traced call of the initialization, down to the first group, with its arguments."""
    records = load(trace_dir, rank)
    by_id = {r["id"]: r for r in records}

    def depth(record):
        return 0 if record["parent"] is None else 1 + depth(by_id[record["parent"]])

    def show(record):
        indent = "  " * depth(record)
        text = f"{display(record['name'])}  {_args_text(record['args'])}".rstrip()
        print(textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "    ",
                            break_on_hyphens=False))

    for i, record in enumerate(records):
        if short(record["name"]) == "new_group":
            print("  " * depth(record) + "new_group × …  (chapter 6)")
            # ... and what initialize_model_parallel does after its groups (the memory buffer)
            for later in records[i:]:
                if later["parent"] == record["parent"] and short(later["name"]) != "new_group":
                    show(later)
            break
        show(record)


def get_model(trace_dir, logs: dict[int, str]) -> None:
    """Each rank's model_provider calls, then the parameter report its log holds."""
    providers(trace_dir)
    print()
    print("\n".join(sorted(line for log in logs.values() for line in log.splitlines()
                           if "number of parameters" in line)))


def providers(trace_dir) -> None:
    for rank in ranks_in(trace_dir):
        for record in load(trace_dir, rank):
            if short(record["name"]) == "model_provider":
                a = record["args"]
                print(f"rank {rank}: pre_process={a['pre_process']!s:5}  post_process={a['post_process']!s:5}  "
                      f"vp_stage={a['vp_stage']}   the global says {a['global_virtual_rank']}")


def microbatches(trace_dir) -> None:
    """Forward passes each rank ran in the first iteration, against the two formulas."""
    for rank in ranks_in(trace_dir):
        records = load(trace_dir, rank)
        step = next(r for r in records if short(r["name"]) == "train_step")
        inside = {step["id"]}
        forwards = 0
        for record in records:  # call order: a parent always comes before its children
            if record["parent"] in inside:
                inside.add(record["id"])
                forwards += short(record["name"]) == "forward_step"
        calc = next(r for r in records if short(r["name"]) == "_build_num_microbatches_calculator")["args"]
        gbs, mbs, dp = calc["global_batch_size"], calc["micro_batch_size"], calc["data_parallel_size"]
        print(f"rank {rank}: {forwards} forward passes;  GBS/MBS = {gbs}/{mbs} = {gbs // mbs};  "
              f"GBS/(MBS·DP) = {gbs}/({mbs}·{dp}) = {gbs // (mbs * dp)}")


def order(trace_dir, first: int = 6) -> None:
    """The first kinds of group in the order rank 0 created them, with the one it kept."""
    records = load(trace_dir, 0)
    kept = {}
    for record in records:
        args = record["args"]
        if short(record["name"]) == "new_group" and 0 in args.get("ranks", []):
            kept.setdefault(args["group_desc"], args["ranks"])
    kinds = group_kinds_in_order(records)
    for i, kind in enumerate(kinds[:first], 1):
        print(f"{i:2}. {kind:34} rank 0 kept {kept.get(kind)}")
    print(f"    ... {len(kinds) - first} kinds more")


# --- tp-cp: who holds the tokens of one micro-batch -----------------------------------------
def _my_positions(seq: int) -> list[int]:
    """The token positions this rank holds: its context-parallel chunks (Megatron's split into
    2·CP pieces, piece i and 2·CP-1-i, so causal attention costs every rank the same), then its
    sequence-parallel share of them (the tp ranks split the sequence dimension in turn)."""
    from minitron.core import parallel_state as mpu

    cp, cp_rank = mpu.get_context_parallel_world_size(), mpu.get_context_parallel_rank()
    tp, tp_rank = mpu.get_tensor_model_parallel_world_size(), mpu.get_tensor_model_parallel_rank()
    piece = seq // (2 * cp)
    mine = [p for i in (cp_rank, 2 * cp - 1 - cp_rank) for p in range(i * piece, (i + 1) * piece)]
    share = len(mine) // tp
    return mine[tp_rank * share:(tp_rank + 1) * share]


def _tp_cp_body(rank: int):
    import torch.distributed as dist

    from minitron.core import parallel_state as mpu

    group = mpu.get_tensor_and_context_parallel_group()
    held = [None] * dist.get_world_size(group)
    dist.all_gather_object(held, _my_positions(16), group=group)
    members = dist.get_process_group_ranks(group)
    return members, mpu.get_data_parallel_rank(), _my_positions(16), held


def tp_cp_lines(world: int = 8, tp: int = 2, cp: int = 2) -> list[str]:
    from minitron.core import parallel_state as mpu
    from minitron.launcher import LaunchConfig, run_on_ranks

    def body(rank):
        mpu.initialize_model_parallel(tp, 1, None, context_parallel_size=cp)
        try:
            return _tp_cp_body(rank)
        finally:
            mpu.destroy_model_parallel()

    lines, shown = [], set()
    for rank, (members, dp_rank, mine, held) in enumerate(run_on_ranks(body, LaunchConfig(world_size=world))):
        if tuple(members) in shown:
            continue
        shown.add(tuple(members))
        union = sorted(p for part in held for p in part)
        lines.append(f"tp-cp group {members} (data-parallel rank {dp_rank}): token positions held\n  "
                     + "   ".join(f"rank {r}: {','.join(map(str, part))}" for r, part in zip(members, held))
                     + f"\n  together: {len(union)} positions, each once: "
                     + ("the whole 16-token sequence" if union == list(range(16)) else f"{union}"))
    return lines


if __name__ == "__main__":
    mode, *rest = sys.argv[1:] or ["help"]
    if mode == "chain" and rest:
        chain(rest[0], int(rest[1]) if len(rest) > 1 else 0)
    elif mode in ("providers", "microbatches", "order") and rest:
        globals()[mode](rest[0])  # a trace directory written elsewhere
    elif mode in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            trace_dir, logs = run_pretrain(*RUNS[mode], tmp)
            if mode == "get_model":
                get_model(trace_dir, logs)
            else:
                globals()[mode](trace_dir)
    elif mode == "tp-cp":
        print("\n".join(tp_cp_lines()))
    elif mode in ("store", "timing"):
        # Appendix A's demos live in a module of their own: they start processes and read no
        # trace. (Python puts this folder on sys.path for a script in it.)
        import journey_launch

        if mode == "store":
            journey_launch.store()
        else:
            journey_launch.timing(int(rest[0]) if rest else 4)
    else:
        raise SystemExit(__doc__)
