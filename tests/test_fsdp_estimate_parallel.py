"""`minitron estimate --use-megatron-fsdp` beyond tp = pp = ep = 1, against execution.

One launch of 4 forked gloo ranks runs each layout in turn through pretrain's path (optim_grads_params,
Megatron's default strategy), one traced train_step on a 2- or 4-layer GPT (hidden 32); each rank measures what
it holds, as tests/test_fsdp_estimate.py does (its units' parameter bytes at their peak, its
gradient bytes, its optimizer state after the step). Then, on every rank, these and the bytes
and calls handed to each group kind inside that train_step equal the estimate exactly:

* pp 2 x dp 2, interleaved (4 layers, 2 virtual stages of one layer per rank), tied embedding:
  each stage's own units in each of its chunks, the tied embedding a unit of its own on the first
  and last stage, its pieces summed over the embedding group; at the peak every chunk's own units
  are gathered, but only one layer of all of them (a layer is freed after its forward);
* tp 2 + sequence parallelism x dp 2, bf16 with fp8 weights (--fp8-param-gather, delayed):
  the layernorms' partial gradients summed over TP on the pieces each rank owns (so rank 0,
  which owns none of the final norm, hands fewer bytes than rank 1), and each layer's fp8 unit
  at one byte an element;
* ep 2 x dp 2 (4 experts): each layer's experts a unit of their own over the expert-data-parallel
  group (2 ranks here, as dp), the dense rest over dp.
"""

from __future__ import annotations

import pytest

from distributed import run_each
from minitron.cli.common import validate_pretrain
from minitron.cli.views.diff import comm_by_key
from minitron.trace.reader import TRAIN_STEP, load_trace
from minitron.training import theoretical_memory_usage as tmu
from minitron.training.tokenizer import build_tokenizer

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--ffn-hidden-size", "71", "--micro-batch-size", "1", "--global-batch-size", "4", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023", "--distributed-backend", "gloo", "--clip-grad", "1.0",
         "--use-megatron-fsdp", "--train-iters", "1"]
LAYOUTS = {
    "pp2": ["--pipeline-model-parallel-size", "2", "--num-layers", "4", "--num-layers-per-virtual-pipeline-stage", "1",
            "--global-batch-size", "8"],
    "tp2-sp-fp8": ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--bf16", "--ffn-hidden-size", "64",
                   "--fp8-format", "hybrid", "--fp8-param-gather"],
    "ep2": ["--expert-model-parallel-size", "2", "--num-experts", "4", "--moe-router-topk", "2"],
}


def _held(argv):
    def body(rank):
        from minitron.core.distributed.fsdp.unit import FSDPUnit
        from minitron.pretrain_gpt import ARGS_DEFAULTS, forward_step, model_provider, train_valid_test_datasets_provider
        from minitron.training.data import build_train_valid_test_data_iterators
        from minitron.training.global_vars import get_args
        from minitron.training.initialize import initialize_megatron
        from minitron.training.model_setup import setup_model_and_optimizer
        from minitron.training.training import train_step

        initialize_megatron(args_defaults=ARGS_DEFAULTS, argv=argv)
        get_args().iteration = get_args().consumed_train_samples = get_args().curr_iteration = 0
        train_iter, _, _ = build_train_valid_test_data_iterators(train_valid_test_datasets_provider)
        model, optimizer, scheduler = setup_model_and_optimizer(model_provider, "encoder_or_decoder")
        def now(key):   # every model chunk's (the interleaved schedule's virtual stages)
            return sum(chunk.bytes_held()[key] for chunk in model)
        peak, gather = [now("params")], FSDPUnit._all_gather

        def measured_gather(unit):   # the high-water mark of gathered units
            gather(unit)
            peak[0] = max(peak[0], now("params"))
        FSDPUnit._all_gather = measured_gather
        train_step(forward_step, train_iter, model, optimizer, scheduler)
        FSDPUnit._all_gather = gather
        state = [t for s in optimizer.optimizer.state.values() for k, t in s.items() if k != "step"]
        state += [main for piece, main, _ in optimizer.pieces if main is not piece]
        return {"params": peak[0], "grads": now("grads"),
                "optimizer": sum(t.numel() * t.element_size() for t in state)}
    return body


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Every layout on one launch of 4 ranks, each rank running them in turn, each traced into
    its own directory (tests/distributed.py run_each)."""
    out = tmp_path_factory.mktemp("fsdp_parallel")
    argvs = {name: [*MODEL, *flags] for name, flags in LAYOUTS.items()}
    held = run_each(out, 4, {name: _held(argv) for name, argv in argvs.items()})
    estimated = {}
    for name, argv in argvs.items():
        args = validate_pretrain(argv, 4)
        build_tokenizer(args)
        estimated[name] = name, held[name], load_trace(out / name / "trace"), tmu.report_theoretical_memory(args), args
    return estimated


@pytest.fixture(params=list(LAYOUTS))
def layout(request, executed):
    return executed[request.param]


def test_estimate_equals_what_each_rank_holds_and_sends(layout):
    name, held, runs, costs, args = layout
    for cost in costs:
        where = f"{name} rank {cost.rank}"
        for key in ("params", "grads", "optimizer"):
            assert held[cost.rank][key] == cost.memory[key], \
                f"{where} {key}: {held[cost.rank][key]} held, {cost.memory[key]} estimated"
        step = next(r for r in runs[cost.rank] if r["name"] == TRAIN_STEP)
        window = [r for r in runs[cost.rank] if step["start_us"] <= r["start_us"] <= step["end_us"]]
        tally = comm_by_key(window, args.params_dtype)
        assert {key: v[0] for key, v in tally.items()} == cost.comm, f"{where}: bytes"
        # calls, but for the pipeline's: the schedule batches its sends and receives, and a batch
        # that only receives is a call the estimate (bytes sent) does not count, for DDP too
        calls = {key: v[1] for key, v in tally.items() if key != "pp"}
        assert calls == {key: n for key, n in cost.calls.items() if key != "pp"}, f"{where}: calls"
    # what makes each layout's count its own: the stages differ, the TP sums differ by dp
    # rank, the experts are reduced over their own group
    if name == "pp2":
        assert costs[0].memory != costs[-1].memory and all("embd" in c.comm for c in costs)
    if name == "tp2-sp-fp8":
        assert len({c.comm["tp"] for c in costs}) == 2
    if name == "ep2":
        assert all(c.calls.get("expt-dp") for c in costs)
