"""The measuring half of scripts/compare_sharding.py: what a rank's model and optimizer hold,
sampled while `pretrain` runs, and what rank 0 called in the last iteration.

While it launches the ranks, the parent patches three places, so each rank inherits them (and
puts them back after):
``training.train`` (to hook the model and optimizer it is handed, and to measure once training
is done), Megatron-FSDP's per-unit all-gather and ZeRO-3's per-module gather (to sample the
moment parameters are whole), and torch's one-tensor gather and reduce-scatter, through which
FSDP2 moves its units. Each rank writes ``measured-rank{R}.json``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import weakref
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("params", "grads", "optimizer")
# The parent sets "out" before each launch; a rank sets "probe", and keeps in "gathering" (weakly)
# the outputs of FSDP2's all-gathers, whole parameters not yet copied into the units.
_state = {"out": None, "probe": None, "gathering": []}


def _megatron_measure():
    """docs/examples/memory_per_rank.py's measure(): the one account of a Megatron DDP model
    and its optimizer (fp32 main copies that are not the model's own tensors, and Adam's moments)."""
    spec = importlib.util.spec_from_file_location("memory_per_rank", ROOT / "docs/examples/memory_per_rank.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.measure


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def held(model, optimizer) -> dict:
    """Bytes this rank holds now: parameters, gradients, optimizer state (master + moments)."""
    from minitron.core.distributed.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel
    from minitron.runtime.engine import DeepSpeedEngine

    chunk = model[0]
    if type(chunk).__name__ == "TorchFullyShardedDataParallel":   # imported only under --use-torch-fsdp2
        # The shards stay while a unit is whole (its parameters are then plain tensors, by
        # storage), and a gather's output is memory before it is copied in: tests/test_torch_fsdp2.py's
        # count, which the estimate matches.
        shards = _state["shards"]
        whole = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                 for p in chunk.module.parameters() if not hasattr(p, "to_local")}
        gathering = sum(t.untyped_storage().nbytes() for t in (ref() for ref in _state["gathering"]) if t is not None)
        state = [t.to_local() for s in optimizer.optimizer.state.values() for k, t in s.items() if k != "step"]
        return {"params": shards + sum(whole.values()) + gathering, "grads": chunk.bytes_held()["grads"],
                "optimizer": _nbytes(state)}
    if isinstance(chunk, DeepSpeedEngine):   # ZeRO's own account (stage_1_and_2.py, stage3.py)
        b = chunk.bytes_held()
        return {"params": b["params"], "grads": b["grads"], "optimizer": b["optimizer_states"]}
    if isinstance(chunk, FullyShardedDataParallel):
        b = chunk.bytes_held()
        inner = optimizer.optimizer
        state = [t for s in inner.state.values() for k, t in s.items() if k != "step"]
        mains = [main for piece, main, _ in optimizer.pieces if main is not piece]   # fp32 copies of 16-bit pieces
        return {"params": b["params"], "grads": b["grads"], "optimizer": _nbytes(state) + _nbytes(mains)}
    m = _megatron_measure()(model, optimizer)
    return {"params": m["parameters"], "grads": m["gradients"],
            "optimizer": m["fp32 main params"] + m["Adam moments"]}


def _total(h: dict) -> int:
    return sum(h[k] for k in KINDS)


@contextmanager
def _installed():
    """Patch, in the parent, the places every rank will run through (see the module docstring),
    and put them back after: a caller in the same process (a test's worker) runs on unpatched."""
    import torch

    from minitron.core.distributed.fsdp.unit import FSDPUnit
    from minitron.runtime.engine import DeepSpeedEngine
    from minitron.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from minitron.training import training

    saved = [(FSDPUnit, "_all_gather", FSDPUnit._all_gather),
             (torch.distributed, "all_gather_single", torch.distributed.all_gather_single),
             (torch.distributed, "reduce_scatter_single", torch.distributed.reduce_scatter_single),
             (DeepSpeedZeroOptimizer_Stage3, "gather", DeepSpeedZeroOptimizer_Stage3.gather),
             (training, "train", training.train)]

    def sampled(original):
        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            if _state["probe"] is not None:
                _state["probe"]()
            return result
        return wrapper

    FSDPUnit._all_gather = sampled(FSDPUnit._all_gather)
    # FSDP2 gathers through torch's one-tensor collectives (torch_fully_sharded_data_parallel.py):
    # sample as each gather starts (its output counted) and before each reduction.
    gather, scatter = torch.distributed.all_gather_single, torch.distributed.reduce_scatter_single

    def gather_sampled(output, *args, **kwargs):
        _state["gathering"].append(weakref.ref(output))
        if _state["probe"] is not None:
            _state["probe"]()
        return gather(output, *args, **kwargs)

    def scatter_sampled(*args, **kwargs):
        if _state["probe"] is not None:
            _state["probe"]()
        return scatter(*args, **kwargs)
    torch.distributed.all_gather_single, torch.distributed.reduce_scatter_single = gather_sampled, scatter_sampled
    DeepSpeedZeroOptimizer_Stage3.gather = sampled(DeepSpeedZeroOptimizer_Stage3.gather)
    real_train = training.train

    def train(forward_step_func, model, optimizer, *args, **kwargs):
        seen = {"peak": None, "peak_params": 0, "step": None}
        if hasattr(model[0], "bytes_held"):   # before the first forward: every unit sharded
            _state["shards"] = model[0].bytes_held()["params"]

        def probe():
            now = held(model, optimizer)
            seen["peak_params"] = max(seen["peak_params"], now["params"])
            if seen["peak"] is None or _total(now) > _total(seen["peak"]):
                seen["peak"] = now

        # The step's entry: every gradient reduced, the optimizer state of the last step there.
        # (--deepspeed's train_step calls engine.step, which steps ZeRO's optimizer inside.)
        owner = model[0] if isinstance(model[0], DeepSpeedEngine) else optimizer
        step = owner.step

        def measured_step(*a, **k):
            seen["step"] = held(model, optimizer)
            probe()
            result = step(*a, **k)
            probe()
            return result
        owner.step = measured_step
        _state["probe"] = probe
        try:
            result = real_train(forward_step_func, model, optimizer, *args, **kwargs)
        finally:
            _state["probe"] = None
            del owner.step
        numel = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model[0].parameters())
        report = {**seen, "rest": held(model, optimizer), "numel": numel}
        Path(_state["out"], f"measured-rank{os.environ['RANK']}.json").write_text(json.dumps(report))
        return result

    training.train = train
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def launch_measured(argv: list[str], world: int, out: Path) -> tuple[list, list]:
    """`pretrain` with ``argv`` on ``world`` forked ranks, traced into out/trace: (each rank's
    measures, the losses of each iteration)."""
    from minitron.launcher import LaunchConfig, RankFailure, Target, launch, session_env

    out.mkdir(parents=True)
    _state["out"] = out
    cfg = LaunchConfig(world_size=world, log_dir=out / "logs", env=session_env(world, out / "trace"))
    try:
        with _installed():
            launch(cfg, Target(module="minitron.pretrain_gpt", argv=[*argv, "--log-jsonl", str(out / "it.jsonl")]))
    except RankFailure as failure:
        raise SystemExit(f"{failure}\n{failure.log_tail(30)}") from None
    ranks = [json.loads((out / f"measured-rank{r}.json").read_text()) for r in range(world)]
    losses = [json.loads(line)["lm_loss"] for line in open(out / "it.jsonl")]
    return ranks, losses


def last_iteration_calls(records: list[dict], world: int) -> dict:
    """(kind, group key, group size) -> [calls, bytes handed] of the torch.distributed calls
    made inside the last train_step."""
    from minitron.cli.views.diff import SETUP, call_bytes, group_key, inside
    from minitron.trace.reader import TRAIN_STEP
    from minitron.trace.schema import DIST

    last = [r for r in records if r["name"] == TRAIN_STEP][-1]
    tally = defaultdict(lambda: [0, 0])
    for r in inside(records, TRAIN_STEP):
        if last["start_us"] <= r["start_us"] <= last["end_us"] and r["name"].startswith(DIST) and r["name"] not in SETUP:
            ranks = r["args"].get("ranks")
            size = len(ranks) if isinstance(ranks, list) else world   # the world's are written "all"
            entry = tally[(r["name"][len(DIST):], group_key(r["args"]), size)]
            entry[0] += 1
            entry[1] += call_bytes(r)
    return dict(tally)


def collectives(trace_dir: Path, world: int) -> dict:
    """Rank 0's calls in the last iteration, and whether every rank made the same ones."""
    from minitron.trace.reader import load_trace

    runs = load_trace(trace_dir)
    per_rank = [last_iteration_calls(runs[r], world) for r in range(world)]
    rows = [{"kind": kind, "group": group, "group_size": size, "calls": n, "bytes": b}
            for (kind, group, size), (n, b) in sorted(per_rank[0].items())]
    same = all(sorted(p) == sorted(per_rank[0]) and all(p[k][0] == per_rank[0][k][0] for k in p) for p in per_rank)
    return {"collectives": rows, "same_calls_on_every_rank": same}
