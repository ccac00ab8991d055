"""What ZeRO++ and stage 3's knobs send, per rank and iteration, measured on 4 forked gloo ranks
faked as 2 nodes of 2 (tests/zeropp_cases.py: a three-linear net, 5,248 fp32 parameters, Adam,
one micro-batch per rank), beside what ``minitron estimate``'s arithmetic says
(training/theoretical_zeropp.py).

    python scripts/show_zeropp.py            ZeRO++ beside plain ZeRO-3, the second iteration
    python scripts/show_zeropp.py knobs      stage 3's knobs beside plain ZeRO-3, both iterations
    python scripts/show_zeropp.py --measure  run the ranks again (about 15 s) and rewrite
                                             docs/zeropp-runs/zeropp.json, which the two above read

The tables read the committed measurement, so the book builds without launching ranks;
tests/test_ds_zeropp.py runs the same ranks and checks that they still measure what it holds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "zeropp-runs" / "zeropp.json"
sys.path.insert(0, str(ROOT / "tests"))   # zeropp_cases, zeropp_runs: the cases, the runs, the tallies

ZEROPP = ("zero3", "hpz", "qwz", "qgz", "zeropp")
KNOBS = ("zero3", "persist", "prefetch", "reuse")


def measure() -> dict:
    import tempfile

    from minitron.launcher import LaunchConfig, run_on_ranks, session_env
    from minitron.trace.reader import load_trace
    from zeropp_runs import CASES, WORLD, minitron_runs, step_tallies
    with tempfile.TemporaryDirectory() as where:
        results = run_on_ranks(minitron_runs, LaunchConfig(world_size=WORLD, env=session_env(WORLD, where)))
        records = load_trace(where)[0]
    return {case: {"losses": results[0][case]["losses"], "steps": step_tallies(records, case)} for case in CASES}


def _estimate(case: str, first_step: bool) -> dict:
    from minitron.training.theoretical_comm import _Tally
    from minitron.training.theoretical_zeropp import stage3_comm
    from zeropp_cases import CASES, NODE, WORLD, shapes_by_module
    zero, tally = CASES[case], _Tally()
    shapes = shapes_by_module()
    pieces = [[-(-_numel(s) // WORLD) for s in module] for module in shapes]
    stage3_comm(tally, pieces, [s for module in shapes for s in module], dp=WORLD, e=4, m=1, dp_key="world",
                hpz=zero.get("zero_hpz_partition_size", 1), quantized_weights=zero.get("zero_quantized_weights", False),
                quantized_gradients=zero.get("zero_quantized_gradients", False), local=NODE, first_step=first_step)
    return tally


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _groups(step: dict) -> dict:
    """{"GROUP dtype": [bytes, calls]} -> {GROUP: [dtypes, bytes, calls]}, the estimate's grain."""
    out: dict = {}
    for key, (nbytes, calls) in step.items():
        group, dtype = key.split()
        entry = out.setdefault(group, [[], 0, 0])
        entry[0].append(dtype)
        entry[1] += nbytes
        entry[2] += calls
    return out


def _rows(label: str, step: dict, estimate: dict | None) -> list:
    rows = []
    for group, (dtypes, nbytes, calls) in _groups(step).items():
        row = (label, group, "+".join(dtypes), calls, f"{nbytes:,}")
        rows.append(row if estimate is None else (*row, f"{estimate.get(group, [0])[0]:,}"))
    return rows


def _table(rows: list, header: tuple) -> None:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(f"{{:<{w}}}" if i < 3 else f"{{:>{w}}}" for i, w in enumerate(widths))
    print(line.format(*header))
    print("-" * (sum(widths) + 2 * (len(widths) - 1)))
    for r in rows:
        print(line.format(*r))


def show_zeropp(data: dict) -> None:
    print("Per rank, the second iteration (its forward is the first after a step): the bytes a rank")
    print("hands to gathers and gradient reductions, by group, measured and estimated:\n")
    rows = []
    for case in ZEROPP:
        rows += _rows(case, data[case]["steps"][1], _estimate(case, first_step=False))
    _table(rows, ("run", "group", "dtypes", "calls", "bytes", "estimate"))
    print("\nOf those, on groups whose ranks sit on both nodes (world, QGZ_GLOBAL):\n")
    plain = _across(data["zero3"]["steps"][1])
    for case in ZEROPP:
        step = data[case]["steps"][1]
        across, total = _across(step), sum(b for b, _ in step.values())
        print(f"  {case:<7} {across:>6,} of {total:>6,}   {across / plain:>4.0%} of plain ZeRO-3's")
    print("\nLosses (mean over the 4 ranks), step 1 and step 2:\n")
    for case in ZEROPP:
        print(f"  {case:<7} " + "  ".join(f"{x:.6f}" for x in data[case]["losses"]))


def _across(step: dict) -> int:
    return sum(b for key, (b, _) in step.items() if key.split()[0] in ("world", "QGZ_GLOBAL"))


def show_knobs(data: dict) -> None:
    print("Per rank, gathers and gradient reductions, iteration 1 (the coordinator records its trace)")
    print("and iteration 2 (the trace is complete):\n")
    rows = []
    for case in KNOBS:
        for k, step in enumerate(data[case]["steps"]):
            rows += _rows(f"{case} {k + 1}", step, None)
    _table(rows, ("run, iteration", "group", "dtypes", "calls", "bytes"))
    same = all(data[c]["losses"] == data["zero3"]["losses"] for c in KNOBS)
    print(f"\nLosses equal plain ZeRO-3's, bit for bit, in every run: {same}")


def main(argv: list) -> int:
    if argv[:1] == ["--measure"]:
        DATA.parent.mkdir(parents=True, exist_ok=True)
        DATA.write_text(json.dumps(measure(), indent=1) + "\n")
        print(f"wrote {DATA.relative_to(ROOT)}")
        return 0
    data = json.loads(DATA.read_text())
    (show_knobs if argv[:1] == ["knobs"] else show_zeropp)(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
