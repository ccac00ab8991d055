"""hpZ and stage 3's knobs held against the real DeepSpeed 0.19.8 on its CPU accelerator, in the
same 4 forked gloo ranks (tests/zeropp_cases.py): DeepSpeed's engine and minitron's run each case
in turn, traced.

* The losses are DeepSpeed's (rel 1e-6, as in test_ds_comm_options_peer.py), for plain ZeRO-3,
  hpZ, persistence, prefetch and reuse distance. Both run torch's Adam (``torch_adam``), which
  DeepSpeed's CPU accelerator runs without compiling its FusedAdam first.
* Every all-gather, in order, of the same size, on the same ranks, forward or backward, in both
  steps, is DeepSpeed's: hpZ's backward on the node's two ranks, persistent parameters gathered
  at first use and one by one after each step, prefetch's gathers ahead and reuse distance's
  kept weights. The trace records DeepSpeed's collectives too: it wraps torch.distributed,
  which both call.

qwZ and qgZ are not here: DeepSpeed runs them only through its CUDA quantizer kernels
(CUDAQuantizer and QuantizerBuilder, ops/csrc/quantization), which its CPU accelerator cannot
build. test_ds_zeropp.py holds minitron's quantizer against those kernels' source instead.
"""
import math
import os

import pytest

from deepspeed_child import NEEDS_DEEPSPEED
from distributed import run_ranks
from minitron.trace.reader import load_trace
from zeropp_runs import BACKWARD, CASES, RUN, STEP, WORLD, Net, config, train

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it

PEER = ("zero3", "persist", "prefetch", "reuse", "hpz")   # hpz last: DeepSpeed keeps its group in a global


def _both(rank):
    import deepspeed   # only in the ranks: the tests' parent process stays free of it

    from minitron.runtime import initialize
    from minitron.trace import traced
    out = {}
    for name in PEER:
        for who, init in (("minitron", initialize), ("deepspeed", deepspeed.initialize)):
            @traced(name=RUN, args=lambda name=name, who=who: {"case": f"{name} {who}"})
            def run():
                engine, *_ = init(model=Net(), config=config(CASES[name], torch_adam=True))
                return train(engine, rank)
            out[name, who] = run()
    return out


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    where = tmp_path_factory.mktemp("zeropp-peer")
    return run_ranks(_both, world_size=WORLD, tp=None, trace_dir=str(where)), load_trace(where)


@pytest.mark.parametrize("case", PEER)
def test_losses_are_deepspeeds(both, case):
    for rank in both[0]:
        assert rank[case, "minitron"] == pytest.approx(rank[case, "deepspeed"], rel=1e-6)


def _gathers(records: list, case: str) -> list:
    """Per step of one run, its all-gathers in order: (in backward?, elements handed in, group's
    ranks, "all" for every rank)."""
    run = next(r for r in records if r["name"] == RUN and r["args"]["case"] == case)
    within = [r for r in records if run["start_us"] <= r["start_us"] <= run["end_us"]]
    backward = [r for r in within if r["name"] == BACKWARD]
    out = []
    gathers = [r for r in within if r["name"] == "torch.distributed.all_gather_into_tensor"]
    for step in (r for r in within if r["name"] == STEP):
        calls = []
        for r in gathers:
            if step["start_us"] <= r["start_us"] <= step["end_us"]:
                ranks = r["args"]["ranks"]
                ranks = "all" if ranks == "all" or ranks == list(range(WORLD)) else tuple(ranks)
                calls.append((any(b["start_us"] <= r["start_us"] <= b["end_us"] for b in backward),
                              math.prod(r["args"]["shape"]), ranks))
        out.append(calls)
    return out


@pytest.mark.parametrize("case", PEER)
def test_gathers_are_deepspeeds(both, case):
    """The same all-gathers in the same order, of the same sizes, on the same ranks, in both
    steps (the first records the trace, the second follows it): what is gathered when, kept,
    prefetched and released is DeepSpeed's. Only the gradients' reductions differ in form:
    DeepSpeed coalesces a bucket's into one reduce-scatter, minitron makes one per gradient."""
    for rank, records in both[1].items():
        mine, theirs = _gathers(records, f"{case} minitron"), _gathers(records, f"{case} deepspeed")
        assert mine == theirs
        if case == "hpz":   # the node's pair of ranks serves every backward
            node = tuple(range(rank // 2 * 2, rank // 2 * 2 + 2))
            assert {ranks for inside, _, ranks in sum(mine, []) if inside} == {node}
