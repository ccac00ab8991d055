"""The reading half of scripts/compare_sharding.py: its JSON as two tables and one figure, and
the checks every run must pass before its JSON is written."""

from __future__ import annotations

KINDS = ("params", "grads", "optimizer")
# The collectives the chapter compares, in the order data flows through an iteration.
SHORT = {"all_reduce": "all-reduce", "reduce": "reduce", "reduce_scatter_tensor": "reduce-scatter",
         "all_gather_into_tensor": "all-gather", "broadcast": "broadcast",
         # torch 2.13's one-tensor forms, which FSDP2 calls: the same collectives
         "reduce_scatter_single": "reduce-scatter", "all_gather_single": "all-gather"}
# The estimate counts ZeRO-3's partition alone (theoretical_zero.py): its parameters are held
# against the step's bytes, not the peak's.
PARAMS_AT_STEP = ("ZeRO-3",)
# FSDP2's sampled peak counts its all-gathers' outputs until they are freed, which is when gloo's
# thread drops the finished work: it is the estimate on some ranks and 66,816 bytes more on
# others, differently from run to run. So the estimate must lie between the step and the peak.
PEAK_AT_LEAST = ("FSDP2",)
PARTS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state",
         "gathered": "more at the peak"}


def kib(n: float) -> str:
    return f"{n / 1024:,.1f}"


def _by_kind(row: dict) -> dict:
    """kind -> [calls, bytes] over every group of more than one rank (a group of one sends
    nothing: here the tensor-parallel broadcast of the batch and the model-parallel norm)."""
    out: dict = {}
    for c in row["collectives"]:
        if c["group_size"] == 1:
            continue
        entry = out.setdefault(SHORT.get(c["kind"], c["kind"]), [0, 0])
        entry[0] += c["calls"]
        entry[1] += c["bytes"]
    return out


def tables(report: dict) -> list[str]:
    made = report["produced"]
    n = report["configs"][0]["ranks"][0]["numel"]
    lines = [f"{n:,} fp32 parameters ({kib(4 * n)} KiB), {report['world']} data-parallel ranks, "
             f"{report['iters']} iterations.",
             f"Measured {made['utc']} UTC at commit {made['commit']}, torch {made['torch']}, {made['backend']}.",
             *([f"Uncommitted changes then: {', '.join(made['uncommitted'])}."] if made.get("uncommitted") else []),
             "", "KiB held by rank 0 at the last optimizer step's entry, and at the highest moment sampled:", "",
             f"{'configuration':<24}{'params':>10}{'grads':>10}{'optimizer':>11}{'at step':>10}{'peak':>10}"]
    for row in report["configs"]:
        r0 = row["ranks"][0]
        at = [r0["step"][k] for k in KINDS]
        peak = sum(r0["peak"][k] for k in KINDS)
        lines.append(f"{row['name']:<24}" + "".join(f"{kib(v):>10}" for v in at[:2]) + f"{kib(at[2]):>11}"
                     + f"{kib(sum(at)):>10}{kib(peak):>10}")
    kinds = list(dict.fromkeys(k for row in report["configs"] for k in _by_kind(row)))
    order = [k for k in dict.fromkeys(SHORT.values()) if k in kinds] + [k for k in kinds if k not in SHORT.values()]
    lines += ["", "Collectives rank 0 called in the last iteration, over groups of more than one rank:",
              "calls × KiB handed to them (B: bytes, where under a KiB)", "",
              f"{'configuration':<24}" + "".join(f"{k:>17}" for k in order)]
    for row in report["configs"]:
        got = _by_kind(row)
        cells = [f"{got[k][0]} × {kib(got[k][1]) if got[k][1] >= 1024 else f'{got[k][1]} B'}" if k in got else "-"
                 for k in order]
        lines.append(f"{row['name']:<24}" + "".join(f"{c:>17}" for c in cells))
    serial = report.get("serial_losses")
    if serial:
        worst = max(abs(a - b) for row in report["configs"] for a, b in zip(row["losses"], serial))
        lines += ["", f"losses of the serial run: {', '.join(f'{v:.6f}' for v in serial)}; the largest difference",
                  f"of any configuration from them: {worst:.1e} (tolerance {report['loss_tolerance']:.0e})"]
    return lines


def figure(report: dict) -> str:
    """Stacked bars, one per configuration: rank 0's bytes at the step, and what the peak adds."""
    from minitron.cli.views.svg_curves import bars_svg

    rows = {}
    for row in report["configs"]:
        r0 = row["ranks"][0]
        at = {PARTS[k]: r0["step"][k] for k in KINDS}
        at[PARTS["gathered"]] = max(0, sum(r0["peak"][k] for k in KINDS) - sum(at.values()))
        rows[row["name"]] = at
    return bars_svg(rows, heading=f"bytes on rank 0 of {report['world']}, at the optimizer step and at the peak")


def _close(a: list, b: list, tol: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def check(report: dict) -> list[str]:
    """What must hold of every run, one line per failure: the losses are the serial run's, every
    rank calls the same collectives, and rank 0 holds and hands over what the estimate says."""
    problems = []
    for row in report["configs"]:
        name, r0, est = row["name"], row["ranks"][0], row["estimate"]
        serial = report.get("serial_losses")
        if serial and not _close(row["losses"], serial, report["loss_tolerance"]):
            problems.append(f"{name}: losses {row['losses']} are not the serial run's {serial}")
        if not row["same_calls_on_every_rank"]:
            problems.append(f"{name}: the ranks made different collectives")
        params = r0["step"]["params"] if name in PARAMS_AT_STEP else r0["peak_params"]
        if name in PEAK_AT_LEAST and r0["step"]["params"] <= est["memory"]["params"] <= params:
            params = est["memory"]["params"]
        measured = {"params": params, "grads": r0["step"]["grads"], "optimizer": r0["rest"]["optimizer"]}
        for k in KINDS:
            if measured[k] != est["memory"][k]:
                problems.append(f"{name}: rank 0 holds {measured[k]:,} bytes of {k}, estimate says {est['memory'][k]:,}")
        groups: dict = {}
        for c in row["collectives"]:
            entry = groups.setdefault(c["group"], [0, 0])
            entry[0] += c["bytes"]
            entry[1] += c["calls"]
        predicted = {g: [est["comm"][g], est["calls"].get(g)] for g in est["comm"]}
        if groups != predicted:
            problems.append(f"{name}: rank 0 sent {groups} (bytes, calls per group), estimate says {predicted}")
    return problems
