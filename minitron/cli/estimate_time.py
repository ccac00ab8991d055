"""`minitron estimate --cluster`: the estimate's bytes and FLOPs as seconds on a described
cluster, and `--compare` to rank layouts by them. The formulas are
minitron/training/theoretical_time.py's, the descriptions minitron/training/clusters.py's;
this module checks the options (one line each, before any arithmetic) and prints.
"""

from __future__ import annotations

from typing import Optional

from minitron.cli.common import UserError, console
from minitron.cli.views.fitted_table import print_fitted
from minitron.cli.views.words import human

MODELLED = ("modelled: compute at the stated MFU, the 1F1B bubble, and every group's collectives at ideal "
            "ring/tree bandwidth plus a latency per message, one after another")
NOT_MODELLED = ("not modelled: overlap of communication with compute (except what --overlap-grad-reduce/"
                "--overlap-param-gather hide), congestion, stragglers, stage imbalance")


def time_options(cluster: Optional[str], mfu: Optional[float], compare: Optional[list[str]],
                 check, iteration_time: Optional[float]):
    """(cluster, mfu, where the MFU came from), or (None, None, None) without --cluster; every
    misuse refused in one line."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.training.clusters import ClusterError, load_cluster
    from minitron.training.theoretical_time import RECORDED_RUN, recorded_mfu

    if cluster is None:
        for given, name in ((mfu, "--mfu"), (compare, "--compare")):
            if given:
                raise UserError(f"{name} prices time on a cluster: add --cluster h100, h200 or FILE")
        return None, None, None
    if check is not None:
        raise UserError("--cluster goes with a prediction, not with --check DIR; drop it")
    if iteration_time is not None:
        raise UserError("--cluster predicts the iteration time that --iteration-time states; give one of them")
    try:
        described = load_cluster(cluster)
    except ClusterError as exc:
        raise UserError(str(exc)) from None
    if mfu is not None:
        if not 0 < mfu <= 1:
            raise UserError(f"--mfu {mfu:g}: give the fraction of peak the kernels reach, above 0 and at most 1")
        return described, mfu, "given"
    try:
        value, source = recorded_mfu()
    except (OSError, ValueError, KeyError):
        raise UserError(f"--mfu: no default without {RECORDED_RUN.name} (minitron's recorded H100 run); "
                        "give --mfu 0.4 or so") from None
    return described, value, source


def render_time(args, costs, cluster, mfu: float, source: str) -> dict:
    """The slowest rank's groups priced, then compute + bubble + communication."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.training.theoretical_time import iteration_time

    t = iteration_time(args, costs, cluster, mfu)
    if not t["groups"]:
        console.print(f"communication on {cluster.name}: none (no group holds more than one rank)", highlight=False)
        print_summary(args, t, source)
        return t
    print_fitted(console, f"communication per iteration on {cluster.name} ({cluster.gpus_per_node} GPUs a node), "
                          f"rank {t['slowest_rank']}, the slowest",
                 ["group", "size", "link", "as", "bytes", "calls", "ring", "tree"],
                 [[g["key"] + ("°" if g["hidden"] else ""), str(g["size"]), g["link"], SHORT[g["collective"]],
                   human(g["nbytes"]), f"{g['calls']:,}", chosen(g["ring_s"], g["seconds"]),
                   "-" if g["tree_s"] is None else chosen(g["tree_s"], g["seconds"])] for g in t["groups"]])
    console.print("* the time counted (the faster; the tree exists for all-reduces only)"
                  + ("; ° partly hidden by Megatron's overlap flags" if any(g["hidden"] for g in t["groups"]) else ""),
                  highlight=False)
    print_summary(args, t, source)
    return t


def print_summary(args, t: dict, source: str) -> None:
    p, v, m = args.pipeline_model_parallel_size, t["virtual_stages"], t["microbatches"]
    # The formula is the bubble's share of compute + bubble; communication, added after, makes its
    # share of the whole iteration smaller, so the two are printed apart, each named.
    console.print(f"compute {seconds(t['compute_s'])} at MFU {t['mfu']:.1%} ({source}) + bubble "
                  f"{seconds(t['bubble_s'])} ((p-1)/(v·m+p-1) = {p - 1}/({v}·{m}+{p - 1}) = "
                  f"{(p - 1) / (v * m + p - 1):.1%} of compute and bubble, {t['bubble_fraction']:.1%} of the "
                  f"iteration) + communication {seconds(t['comm_s'])}", highlight=False)
    console.print(f"iteration: {seconds(t['iteration_s'])}, an MFU of {t['effective_mfu']:.1%} over the whole "
                  "iteration", highlight=False)
    if t["sampled"]:
        console.print("(a huge world: the first 512 ranks of each stage stand for it)", highlight=False)
    console.print(MODELLED, highlight=False)
    console.print(NOT_MODELLED, highlight=False)
    if args.sequence_parallel and args.tensor_model_parallel_size > 1:
        console.print("--sequence-parallel: its tp all-gathers and reduce-scatters are priced as all-reduces of "
                      "the bytes handed, an approximation", highlight=False)


SHORT = {"all-reduce": "all-reduce", "scatter+gather": "rs + ag", "all-to-all": "all-to-all", "send": "send"}


def chosen(s: float, counted: float) -> str:
    return seconds(s) + ("*" if s == counted else " ")


def seconds(s: float) -> str:
    """9,570 ms, 546 ms, 5,850 µs: whole milliseconds (microseconds below 10 ms), three digits or
    more. No decimal point: the docs build marks "1.5 s"-like text as a time it measured, and
    these are modelled, the same in every build."""
    if s >= 0.01:
        return f"{s * 1e3:,.0f} ms"
    return f"{s * 1e6:,.0f} µs" if s else "0"


def layout_argv(text: str) -> list[str]:
    """'tp=8,pp=16,use-distributed-optimizer' -> ['--tp', '8', '--pp', '16', '--use-distributed-optimizer']."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, eq, value = item.partition("=")
        if not name.strip() or (eq and not value.strip()):
            raise UserError(f"--compare {text!r}: {item!r} is not FLAG=VALUE or FLAG (e.g. \"tp=8,pp=16\")")
        out += ["--" + name.strip().lstrip("-")] + ([value.strip()] if eq else [])
    if not out:
        raise UserError(f"--compare {text!r}: an empty layout; give flags as \"tp=8,pp=16\"")
    return out


def compare_layouts(argv: list[str], world: int, layouts: list[str], cluster, mfu: float, source: str,
                    args_for, as_json: bool) -> list[dict]:
    """Each layout's flags over ``argv``'s, estimated and priced; ranked by iteration time, those
    whose largest rank fits the GPU's memory first."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.cli.command import expand_aliases
    from minitron.training.theoretical_memory_usage import report_theoretical_memory
    from minitron.training.theoretical_time import iteration_time

    rows = []
    for text in layouts:
        extra = expand_aliases(layout_argv(text))
        try:
            args = args_for(argv + extra, world)
        except UserError as exc:
            raise UserError(f"--compare {text!r}: {exc}") from None
        costs = report_theoretical_memory(args)
        t = iteration_time(args, costs, cluster, mfu)
        memory = max(sum(c.memory.values()) for c in costs)
        rows.append({"layout": text, "tp": args.tensor_model_parallel_size, "pp": args.pipeline_model_parallel_size,
                     "dp": args.data_parallel_size, "memory": memory, "fits": memory <= cluster.memory_gib * 2**30,
                     **{k: v for k, v in t.items() if k != "groups"}})
    rows.sort(key=lambda r: (not r["fits"], r["iteration_s"]))
    if as_json:
        return rows
    spread = [r["compute_s"] for r in rows]
    same = max(spread) <= min(spread) * 1.001   # the same FLOPs on as many GPUs (the vocabulary's padding aside)
    print_fitted(console, f"layouts on {world:,} GPUs of {cluster.name}, fastest first, those that fit first",
                 ["layout", "dp", "memory"] + ([] if same else ["compute"]) + ["bubble", "comm.", "iteration", "MFU"],
                 [[r["layout"], str(r["dp"]), human(r["memory"]) + ("" if r["fits"] else " !")]
                  + ([] if same else [seconds(r["compute_s"])])
                  + [seconds(r["bubble_s"]), seconds(r["comm_s"]), seconds(r["iteration_s"]),
                     f"{r['effective_mfu']:.1%}"] for r in rows])
    if same:
        console.print(f"compute: {seconds(rows[0]['compute_s'])} in every layout, within 0.1% (the same FLOPs on as many GPUs)",
                      highlight=False)
    if not all(r["fits"] for r in rows):
        console.print(f"! over the GPU's {cluster.memory_gib:g} GiB", highlight=False)
    console.print(f"MFU while computing: {mfu:.1%} ({source})", highlight=False)
    console.print(MODELLED, highlight=False)
    console.print(NOT_MODELLED, highlight=False)
    return rows
