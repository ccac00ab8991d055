"""The six ways ranks exchange tensors, each run once on 4 gloo ranks. Chapter 0 runs this.

    python docs/examples/collectives_demo.py run DIR   # run them, traced into DIR; print what each rank held
    python docs/examples/collectives_demo.py show DIR  # print again what an earlier `run DIR` kept
    python docs/examples/collectives_demo.py cost MB   # the ring rule: bytes per rank for a tensor of MB megabytes
    python -m minitron.cli.views.svg_collectives DIR   # the picture of an earlier `run DIR`

`run` starts 4 forked ranks with minitron's launcher, tracing on (what `minitron launch --world 4
--trace DIR` does). Every rank starts from its own small tensor (rank r holds 10r+1 .. 10r+4, so
every number says where it came from), calls each collective through torch.distributed, and
writes down what it held before and after. The parent then reads the trace the ranks recorded:
each call's shape, dtype and group come from there, and the bytes a rank sent and received are
computed from them with the algorithm NCCL uses for that collective on a ring (the ``moved``
function below says which). gloo on a CPU picks its own algorithms, and its bytes are not
traced; the ring's are the ones a GPU job pays. (Chapter 17 counts the tensors handed to the
calls; this rule turns those into bytes on the wire.)

Everything `run` learns is kept in DIR/collectives.json, which `show` and the picture read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WORLD = 4
SIZE = 4   # elements per rank's tensor: one block per rank, so a reduce-scatter leaves one each
KEPT = "collectives.json"


def start_values(rank: int) -> list[float]:
    """Rank r's own numbers, 10r+1 .. 10r+SIZE: a value's tens digit names the rank it came from."""
    return [10.0 * rank + k for k in range(1, SIZE + 1)]


def on_rank(out_dir: str) -> int:
    """One rank's program: each collective once, on a fresh copy of its own numbers."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor(start_values(rank))
    held: dict[str, dict] = {}

    def note(name: str, before: torch.Tensor, after: torch.Tensor) -> None:
        held[name] = {"before": before.tolist(), "after": after.tolist()}

    # broadcast: rank 0's tensor overwrites everyone's (chapter 7 sends the batch this way).
    t = mine.clone()
    dist.broadcast(t, src=0)
    note("broadcast", mine, t)

    # all-reduce: every rank ends with the element-wise sum over all ranks (chapter 9, 12).
    t = mine.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    note("all-reduce", mine, t)

    # reduce-scatter: the same sum, but rank r keeps only block r of it (chapter 9's sequence
    # parallelism, chapter 12's distributed optimizer).
    out = torch.empty(SIZE // world)
    dist.reduce_scatter_tensor(out, mine.clone(), op=dist.ReduceOp.SUM)
    note("reduce-scatter", mine, out)

    # all-gather: every rank's block, concatenated in rank order, on every rank. Gathering the
    # blocks the reduce-scatter left gives the all-reduce's answer back.
    gathered = torch.empty(SIZE)
    dist.all_gather_into_tensor(gathered, out.clone())
    note("all-gather", out, gathered)

    # all-to-all: rank r sends its block j to rank j and gets block r of every rank: a transpose
    # of the blocks across ranks (chapter 16 sends tokens to their experts this way).
    swapped = torch.empty(SIZE)
    dist.all_to_all_single(swapped, mine.clone())
    note("all-to-all", mine, swapped)

    # send/recv: one pair of ranks at a time, stage r to stage r+1, as a pipeline passes its
    # activations forward (chapter 11). Rank 0 only sends, the last rank only receives.
    got = mine.clone()
    if rank > 0:
        got = torch.empty(SIZE)
        dist.recv(got, src=rank - 1)
    if rank < world - 1:
        dist.send(mine.clone(), dst=rank + 1)
    note("send/recv", mine, got)

    Path(out_dir, f"held{rank}.json").write_text(json.dumps(held))
    dist.destroy_process_group()
    return 0


# Which torch.distributed call each collective is, in the trace.
CALLS = {"broadcast": "broadcast", "all-reduce": "all_reduce", "reduce-scatter": "reduce_scatter_tensor",
         "all-gather": "all_gather_into_tensor", "all-to-all": "all_to_all_single", "send/recv": ("send", "recv")}
ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4}


def moved(name: str, nbytes: int, p: int, rank: int, args: dict) -> tuple[int, int]:
    """(sent, received) bytes of one rank, for a call whose tensor argument is ``nbytes``.

    all-reduce on a ring: a reduce-scatter, then an all-gather, each (p-1)/p of the tensor.
    reduce-scatter: the traced tensor is the input (the whole sum's size); all-gather: the
    traced tensor is the input (one block), and the whole is p blocks. all-to-all: each rank
    keeps its own block and exchanges the other p-1 directly with their owners. broadcast: a
    chain from the root around the ring (NCCL's way), so every rank but the root receives the
    whole tensor once and every rank but the last one passes it on. send/recv: the tensor,
    once, one way.
    """
    if name == "all-reduce":
        each = 2 * (p - 1) * nbytes // p
        return each, each
    if name in ("reduce-scatter", "all-to-all"):
        each = (p - 1) * nbytes // p
        return each, each
    if name == "all-gather":
        each = (p - 1) * nbytes
        return each, each
    if name == "broadcast":
        root = args.get("src", 0)
        position = (rank - root) % p          # 0 for the root, p-1 for the chain's last rank
        return (nbytes if position < p - 1 else 0), (nbytes if position > 0 else 0)
    if name == "send":
        return nbytes, 0
    if name == "recv":
        return 0, nbytes
    raise ValueError(name)


def from_trace(trace_dir: Path, p: int) -> dict[str, dict[int, dict]]:
    """collective -> rank -> {'sent', 'received', 'call', 'shape', 'dtype'}, from the traced calls."""
    from minitron.trace.reader import load_trace

    runs = load_trace(trace_dir)
    found: dict[str, dict[int, dict]] = {name: {} for name in CALLS}
    for rank, records in runs.items():
        for record in records:
            call = record["name"].removeprefix("torch.distributed.")
            for name, calls in CALLS.items():
                if call not in (calls if isinstance(calls, tuple) else (calls,)):
                    continue
                args = record["args"]
                shape = args.get("input_shape") or args["shape"]
                numel = 1
                for d in shape:
                    numel *= d
                nbytes = numel * ITEM[args["dtype"]]
                sent, received = moved(call if name == "send/recv" else name, nbytes, p, rank, args)
                entry = found[name].setdefault(rank, {"sent": 0, "received": 0, "calls": []})
                entry["sent"] += sent
                entry["received"] += received
                entry["calls"].append(f"{call}({shape} {args['dtype']})")
    return found


def run(out_dir: str) -> dict:
    """Start the ranks with tracing on, then gather what they held and what the trace says."""
    from minitron.launcher import LaunchConfig, Target, launch
    from minitron.launcher.worker import session_env

    out = Path(out_dir)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    trace_dir = out / "trace"
    launch(LaunchConfig(world_size=WORLD, log_dir=out / "logs", env=session_env(WORLD, trace_dir), warm=()),
           Target(function=lambda: on_rank(str(out))))
    held = {r: json.loads((out / f"held{r}.json").read_text()) for r in range(WORLD)}
    traffic = from_trace(trace_dir, WORLD)
    kept = {"world": WORLD, "start": {r: start_values(r) for r in range(WORLD)}, "collectives": [
        {"name": name, "ranks": [{**held[r][name], **traffic[name].get(r, {"sent": 0, "received": 0, "calls": []})}
                                 for r in range(WORLD)]}
        for name in CALLS]}
    (out / KEPT).write_text(json.dumps(kept, indent=1))
    return kept


def _numbers(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def show(kept: dict) -> None:
    for collective in kept["collectives"]:
        calls = sorted({c for r in collective["ranks"] for c in r["calls"]})
        print(f"{collective['name']}: " + ", ".join(calls))
        for rank, r in enumerate(collective["ranks"]):
            print(f"  rank {rank}: {_numbers(r['before']):<18} -> {_numbers(r['after']):<18}"
                  f" sent {r['sent']:>2} B, received {r['received']:>2} B")


def cost(megabytes: float) -> None:
    """The ring rule, per rank, for a tensor of ``megabytes`` MB, at a few group sizes; and, for
    contrast, what one rank receives if it collects every tensor to add them up (a star)."""
    n = megabytes * 1e6
    print(f"N = {megabytes:g} MB on every rank; MB each rank sends (and as many it receives), ring algorithms")
    print(f"{'p':>5} {'(p-1)/p':>8} {'reduce-scatter':>15} {'all-gather':>11} {'all-reduce':>11} "
          f"{'all-reduce/N':>13} {'star: root receives':>20}")
    for p in (2, 4, 8, 16, 64, 1024):
        part = (p - 1) / p
        print(f"{p:>5} {part:>8.4f} {part * n / 1e6:>15.1f} {part * n / 1e6:>11.1f} {2 * part * n / 1e6:>11.1f} "
              f"{2 * part:>13.4f} {(p - 1) * n / 1e6:>20.1f}")


def main(argv: list[str]) -> int:
    usage = "usage: collectives_demo.py run DIR | show DIR | cost MB"
    if len(argv) != 2 or argv[0] not in ("run", "show", "cost"):
        print(usage, file=sys.stderr)
        return 2
    if argv[0] == "cost":
        cost(float(argv[1]))
    elif argv[0] == "run":
        show(run(argv[1]))
    else:
        show(json.loads(Path(argv[1], KEPT).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
