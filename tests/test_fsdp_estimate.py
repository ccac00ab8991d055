"""`minitron estimate --use-megatron-fsdp` against execution, strategy by strategy.

One launch of 2 forked gloo ranks runs pretrain's path once per sharding strategy: a fresh
model and optimizer each, one traced train_step each, from one data iterator. fc1 has 71 rows,
so every unit's elements are odd and each unit is padded. Each rank measures what it holds:
the parameter bytes of its units at their peak (optim_grads_params: its shards plus the units
gathered at once), its gradient bytes, and its optimizer state after the step (Adam's two
moments, and the fp32 main copies of a bf16 model's pieces). Then, on every rank, these and
the bytes and calls handed to each group kind inside that train_step equal the estimate
exactly: in fp32, and (a stress case) in bf16 with fp32 gradients, Megatron's default. A fifth
run is optim with --overlap-grad-reduce --ddp-bucket-size 5000: the model is cut into buckets
(the embedding alone, then the layers' parameters across layers), one unit each, as Megatron's
_get_parameter_groups cuts it outside unit modules.
"""

from __future__ import annotations

import pytest

from minitron.cli.common import validate_pretrain
from minitron.cli.views.diff import comm_by_key
from minitron.core.distributed.fsdp import STRATEGIES
from minitron.launcher import LaunchConfig, RankFailure, run_on_ranks, session_env
from minitron.trace.reader import TRAIN_STEP, load_trace
from minitron.training import theoretical_memory_usage as tmu
from minitron.training.tokenizer import build_tokenizer

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--ffn-hidden-size", "71", "--micro-batch-size", "1", "--global-batch-size", "4", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023", "--distributed-backend", "gloo", "--clip-grad", "1.0",
         "--use-megatron-fsdp"]
BUCKETS = ["--overlap-grad-reduce", "--ddp-bucket-size", "5000"]
RUNS = [(strategy, []) for strategy in STRATEGIES] + [("optim", BUCKETS)]


def _held(argv):
    """Each rank: initialize once, then per strategy a fresh model and optimizer and one train_step."""
    def body(rank):
        from minitron.core.distributed.fsdp.unit import FSDPUnit
        from minitron.pretrain_gpt import ARGS_DEFAULTS, forward_step, model_provider, train_valid_test_datasets_provider
        from minitron.training.data import build_train_valid_test_data_iterators
        from minitron.training.global_vars import get_args
        from minitron.training.initialize import initialize_megatron
        from minitron.training.model_setup import setup_model_and_optimizer
        from minitron.training.training import train_step

        initialize_megatron(args_defaults=ARGS_DEFAULTS, argv=argv + ["--train-iters", str(len(RUNS))])
        get_args().iteration = get_args().consumed_train_samples = 0
        train_iter, _, _ = build_train_valid_test_data_iterators(train_valid_test_datasets_provider)
        gather, out = FSDPUnit._all_gather, []
        for strategy, flags in RUNS:
            get_args().data_parallel_sharding_strategy = strategy
            get_args().overlap_grad_reduce, get_args().ddp_bucket_size = (True, 5000) if flags else (False, None)
            model, optimizer, scheduler = setup_model_and_optimizer(model_provider, "encoder_or_decoder")
            fsdp, peak = model[0], [model[0].bytes_held()["params"]]

            def measured_gather(unit, fsdp=fsdp, peak=peak):   # the high-water mark of gathered units
                gather(unit)
                peak[0] = max(peak[0], fsdp.bytes_held()["params"])
            FSDPUnit._all_gather = measured_gather
            get_args().curr_iteration = 0
            train_step(forward_step, train_iter, model, optimizer, scheduler)
            FSDPUnit._all_gather = gather
            # Adam's moments, and the fp32 main pieces of a 16-bit model (an fp32 one steps its own)
            state = [t for s in optimizer.optimizer.state.values() for k, t in s.items() if k != "step"]
            state += [main for piece, main, _ in optimizer.pieces if main is not piece]
            out.append({"params": peak[0], "grads": fsdp.bytes_held()["grads"],
                        "optimizer": sum(t.numel() * t.element_size() for t in state)})
        return out
    return body


PRECISIONS = {"fp32": [], "bf16": pytest.param(["--bf16"], marks=pytest.mark.stress)}


@pytest.mark.parametrize("precision", list(PRECISIONS.values()), ids=list(PRECISIONS))
def test_estimate_equals_what_each_strategy_holds_and_sends(tmp_path, precision):
    argv = [*MODEL, *precision]
    trace_dir = tmp_path / "trace"
    cfg = LaunchConfig(world_size=2, log_dir=tmp_path / "logs", env=session_env(2, trace_dir))
    try:
        held = run_on_ranks(_held(argv), cfg)
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(30)}") from None
    runs = load_trace(trace_dir)
    for k, (strategy, flags) in enumerate(RUNS):
        args = validate_pretrain([*argv, *flags, "--train-iters", "1", "--data-parallel-sharding-strategy", strategy], 2)
        build_tokenizer(args)
        for cost in tmu.report_theoretical_memory(args):
            where = f"{strategy} {' '.join(flags)} rank {cost.rank}"
            for key in ("params", "grads", "optimizer"):
                assert held[cost.rank][k][key] == cost.memory[key], \
                    f"{where} {key}: {held[cost.rank][k][key]} held, {cost.memory[key]} estimated"
            step = [r for r in runs[cost.rank] if r["name"] == TRAIN_STEP][k]
            window = [r for r in runs[cost.rank] if step["start_us"] <= r["start_us"] <= step["end_us"]]
            tally = comm_by_key(window, args.params_dtype)
            assert {key: v[0] for key, v in tally.items()} == cost.comm, f"{where}: bytes"
            assert {key: v[1] for key, v in tally.items()} == cost.calls, f"{where}: calls"
    # optim halves the optimizer state, optim_grads the gradients; optim_grads_params's peak here
    # is *above* whole parameters: its shards plus the gathered rest of the chunk (the embedding,
    # 65% of this tiny model) plus one layer. Sharding parameters pays where layers dominate.
    opt = [held[0][k]["optimizer"] for k in range(4)]
    grads = [held[0][k]["grads"] for k in range(4)]
    assert opt[1] < opt[0] and grads[2] < grads[1] and held[0][3]["params"] > held[0][2]["params"]
    # the buckets: several units, each padded, so more bytes than optim's one unit
    assert held[0][4]["params"] > held[0][1]["params"]
