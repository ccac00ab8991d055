"""Tables for chapters 16 and 16b, read from the rank*.jsonl files of a `minitron trace --steps 1` run
with experts.

    python scripts/moe_tables.py dispatch TRACE_DIR   the first MoE layer's two all-to-alls, per rank
    python scripts/moe_tables.py capacity TRACE_DIR   the router's choices per expert, and what the capacity kept
    python scripts/moe_tables.py grads TRACE_DIR      which group each gradient reduction ran on
    python scripts/moe_tables.py log TRACE_DIR        the losses of the last rank's iteration line
    python scripts/moe_tables.py bias TRACE_DIR       the expert bias of aux-loss-free balancing, step by step

Every number comes from the trace: the split sizes and shapes the all-to-all wrapper recorded
(minitron/trace/torch_hooks.py), the token counts SequentialMLP.forward recorded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(trace_dir: Path) -> dict[int, list[dict]]:
    ranks = {}
    for path in sorted(trace_dir.glob("rank*.jsonl")):
        records = [json.loads(line) for line in path.open()]
        ranks[records[0]["rank"]] = records
    return ranks


def children(records: list[dict], parent_id: int) -> list[dict]:
    return [r for r in records if r.get("parent") == parent_id]


def first_call(records: list[dict], suffix: str) -> dict:
    return next(r for r in records if r["name"].endswith(suffix))


def descendants(records: list[dict], parent_id: int, suffix: str) -> list[dict]:
    found, frontier = [], [parent_id]
    while frontier:
        kids = [r for pid in frontier for r in children(records, pid)]
        found += [r for r in kids if r["name"].endswith(suffix)]
        frontier = [r["id"] for r in kids]
    return found


def print_heading(title: str, header: str) -> None:
    """A table's title, its column names and a rule under them."""
    print(title)
    print(header)
    print("-" * len(header))


def dispatch(trace_dir: Path) -> None:
    ranks = load(trace_dir)
    print_heading("The first micro-batch through the first MoE layer, on every rank:\n",
                  f"{'rank':>4}  {'ep group':<9}{'experts':<9}{'sends to ep peers':<19}{'receives':<14}"
                  f"{'rows per expert':<17}{'returns'}")
    for rank, records in sorted(ranks.items()):
        layer = first_call(records, "MoELayer.forward")
        experts = layer["args"]["local_experts"]
        out = descendants(records, layer["id"], "token_permutation")[0]
        back = descendants(records, layer["id"], "token_unpermutation")[0]
        there = descendants(records, out["id"], "all_to_all_single")[0]["args"]
        home = descendants(records, back["id"], "all_to_all_single")[0]["args"]
        rows = descendants(records, layer["id"], "SequentialMLP.forward")[0]["args"]["tokens_per_expert"]
        print(f"{rank:>4}  {str(there['ranks']):<9}{', '.join(map(str, experts)):<9}"
              f"{str(there['input_split_sizes']):<19}{str(there['output_split_sizes']):<14}"
              f"{str(rows):<17}{home['output_split_sizes']}")
    hidden = first_call(next(iter(ranks.values())), "MoELayer.forward")["args"]["hidden_states"]
    shape = hidden["tensor"] if isinstance(hidden, dict) else hidden
    print(f"\nEvery rank's layer input is [s, b, h] = {shape}: {shape[0] * shape[1]} tokens, each sent to its"
          "\ntop-2 experts, so a rank sends twice as many rows as it has tokens.")


def capacity(trace_dir: Path) -> None:
    """The router's choices per expert beside what the capacity let through, first MoE layer."""
    ranks = load(trace_dir)
    print_heading("The first micro-batch through the first MoE layer, on every rank:\n",
                  f"{'rank':>4}  {'tokens':>6}  {'capacity':>8}  {'chosen per expert':<19}{'kept per expert':<17}{'dropped':>7}")
    for rank, records in sorted(ranks.items()):
        layer = first_call(records, "MoELayer.forward")
        drop = descendants(records, layer["id"], "apply_router_token_dropping")[0]["args"]
        kept = descendants(records, layer["id"], "token_permutation")[0]["args"]["rows_per_expert"]
        chosen = drop["chosen_per_expert"]
        lost = sum(max(c - k, 0) for c, k in zip(chosen, kept))
        print(f"{rank:>4}  {drop['tokens']:>6}  {drop['capacity']:>8}  {str(chosen):<19}{str(kept):<17}{lost:>7}")


def grads(trace_dir: Path) -> None:
    ranks = load(trace_dir)
    print_heading("The gradient reductions of the step (finalize_model_grads), on every rank:\n",
                  f"{'rank':>4}  {'collective':<16}{'group':<30}{'ranks':<15}{'elements':>9}")
    for rank, records in sorted(ranks.items()):
        final = first_call(records, "finalize_model_grads")
        for sync in descendants(records, final["id"], "start_grad_sync"):
            for call in children(records, sync["id"]):
                args = call["args"]
                name = call["name"].rsplit(".", 1)[-1]
                print(f"{rank:>4}  {name:<16}{args['group']:<30}{str(args['ranks']):<15}"
                      f"{args['shape'][0]:>9}")


def log(trace_dir: Path) -> None:
    last = max(trace_dir.glob("logs/rank*.log"), key=lambda p: int(p.stem[4:]))
    line = next(l for l in last.read_text().splitlines() if " iteration " in l)
    fields = [f.strip() for f in line.split("|") if "loss:" in f or "grad norm" in f]
    print(" | ".join(fields))


def bias(trace_dir: Path) -> None:
    """Rank 0's first MoE layer after each step (finish_router_step's record): the bias it
    routed with, and the tokens it sent each expert."""
    records = load(trace_dir)[0]
    steps = [r["args"] for r in records if r["name"].endswith("finish_router_step")]
    experts = len(steps[0]["expert_bias"][0])
    print_heading("The first MoE layer on rank 0, step by step (finish_router_step's record):\n",
                  f"{'step':>4}  {'tokens per expert (rank 0)':<28}expert bias it routed with")
    for step, args in enumerate(steps, start=1):
        counts, bias = args["tokens_per_expert"][0], args["expert_bias"][0]
        print(f"{step:>4}  {str(counts):<28}{' '.join(f'{b:+.3f}' for b in bias[:experts])}")


if __name__ == "__main__":
    {"dispatch": dispatch, "capacity": capacity, "grads": grads, "log": log, "bias": bias}[sys.argv[1]](Path(sys.argv[2]))
