"""--overlap-grad-reduce and --overlap-param-gather: the same numbers, communication moved.

pretrain_gpt on 2 forked gloo ranks (dp 2), two iterations of a bf16 toy GPT (its gradient
buckets fp32, Megatron's default), small buckets so that it has several. Overlapping changes *when* each bucket's collective runs, not what it sums:
the losses of ZeRO-1 with both overlaps equal the plain synchronous run's bit for bit (dp 2:
each element is one a + b either way; ZeRO-1's fp32 shards step as the whole does). Without
the distributed optimizer, tests/test_ddp_grads.py trains the all-reduce buckets alone against
synchronous DDP, step for step, on ranks it has already started (a launch here costs seconds).
The traced run shows where the collectives went, iteration by iteration:
* the first iteration launches every reduction from finalize_model_grads (it learns which
  gradients each bucket waits for); later ones launch them inside backward;
* with --overlap-param-gather, optimizer.step gathers nothing; each bucket's all-gather is
  launched and waited for inside the next forward.
"""

import argparse
import json

import pytest

from distributed import pretrain_records
from minitron.cli.estimate_check import grad_elements as _grad_elements, traced_buffer as _traced_buffer
from minitron.cli.views.diff import comm_by_key, recorded_args
from minitron.launcher import LaunchConfig, RankFailure, Target, launch, session_env
from minitron.trace.reader import load_trace
from minitron.training.theoretical_memory_usage import report_theoretical_memory
from minitron.training.tokenizer import build_tokenizer

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo", "--bf16"]
OVERLAP = ["--overlap-grad-reduce", "--ddp-bucket-size", "20000"]
DISTOPT = ["--use-distributed-optimizer"]
GROUP = "minitron.core.distributed.param_and_grad_buffer._ParamAndGradBucketGroup."


def _losses(tmp_path, name, *flags):
    return [r["lm_loss"] for r in pretrain_records(tmp_path / name, 2, [*MODEL, *flags])]


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    """dp 2, ZeRO-1, both overlaps, traced: (losses, rank 0's records, the trace directory)."""
    out = tmp_path_factory.mktemp("overlap")
    argv = [*MODEL, *DISTOPT, *OVERLAP, "--overlap-param-gather", "--log-jsonl", str(out / "it.jsonl")]
    config = LaunchConfig(world_size=2, log_dir=out / "logs", env=session_env(2, out / "trace"))
    try:
        launch(config, Target(module="minitron.pretrain_gpt", argv=argv))
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(30)}") from None
    losses = [json.loads(line)["lm_loss"] for line in open(out / "it.jsonl")]
    return losses, load_trace(out / "trace")[0], out / "trace"


def _ancestors(record, by_id):
    names = []
    while record.get("parent") in by_id:
        record = by_id[record["parent"]]
        names.append(record["name"].rsplit(".", 1)[-1])
    return names


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The same run without either overlap (and without ZeRO-1)."""
    return _losses(tmp_path_factory.mktemp("plain"), "plain")


def test_overlap_keeps_the_losses(plain, traced_run):
    assert traced_run[0] == plain   # ZeRO-1 with both overlaps
    assert plain[-1] != plain[0]    # the weights moved: the gathers carried new values


def test_trace_shows_collectives_inside_backward_and_forward(traced_run):
    _, records, _ = traced_run
    by_id = {r["id"]: r for r in records}
    steps = [r for r in records if r["name"].endswith("training.train_step")]
    assert len(steps) == 2

    def inside(step, name):
        return [r for r in records if r["name"] == GROUP + name
                and step["start_us"] <= r["start_us"] <= step["end_us"]]

    first, second = steps[0], steps[1]
    launches = inside(second, "start_grad_sync")
    assert len(launches) > 1 and all(r["args"]["async"] for r in launches)
    # bf16 weights, fp32 gradient buckets: Megatron's default (--grad-reduce-in-bf16 not given).
    assert {r["args"]["dtype"] for r in launches} == {"float32"}
    # From the second iteration on, each bucket's reduction is launched by a backward hook...
    assert all("backward_step" in _ancestors(r, by_id) for r in launches)
    # ...and finalize_model_grads only waits for it (it was in flight when the wait began).
    waits = inside(second, "finish_grad_sync")
    assert len(waits) == len(launches) and all(r["args"]["in_flight"] for r in waits)
    assert all("finalize_model_grads" in _ancestors(r, by_id) for r in waits)
    # The first iteration launched from finalize_model_grads instead.
    assert all("finalize_model_grads" in _ancestors(r, by_id) for r in inside(first, "start_grad_sync"))

    # Parameters: launched and waited for inside forward_step, never by optimizer.step.
    gathers = inside(second, "start_param_sync")
    assert len(gathers) == len(launches) and all(r["args"]["async"] for r in gathers)
    assert all("forward_step" in _ancestors(r, by_id) for r in gathers)
    every_gather = [r for r in records if r["name"] == GROUP + "start_param_sync"]
    assert not any("MegatronOptimizer.step" in by_id[r["parent"]]["name"] or "step" in _ancestors(r, by_id)
                   for r in every_gather if r["parent"] in by_id)
    # Each was waited for once, inside forward_step too (the first at once: nothing ran ahead of it).
    param_waits = inside(second, "_wait_param_gather")
    assert sorted(r["args"]["bucket"] for r in param_waits) == sorted(r["args"]["bucket"] for r in gathers)
    assert all("forward_step" in _ancestors(r, by_id) for r in param_waits)


def test_estimate_lays_out_the_same_buckets(traced_run):
    """`minitron estimate`'s buffer (bucketed, every bucket padded for ZeRO-1) is the one the
    run built, and the bytes each group kind moved are the prediction's, once per train_step."""
    runs = load_trace(traced_run[2])
    args = argparse.Namespace(**recorded_args(runs))
    build_tokenizer(args)   # sets padded_vocab_size, as estimate does for a recorded run
    costs = {c.rank: c for c in report_theoretical_memory(args)}
    for rank, records in runs.items():
        assert _traced_buffer(records) == _grad_elements(args, costs[rank])
        traced = {key: sent for key, (sent, _) in comm_by_key(records, args.params_dtype).items()}
        assert traced == {key: 2 * sent for key, sent in costs[rank].comm.items()}   # two iterations
