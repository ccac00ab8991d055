"""--overlap-grad-reduce on an MoE model: the expert buckets overlap with backward too.

Megatron hooks every parameter, dense and expert alike, so an expert bucket's reduction (over
the expert-data-parallel group) is launched in backward once its last gradient has arrived,
as a dense bucket's is. pretrain_gpt on 4 forked gloo ranks, ep 2 (dense dp 4, expert dp 2),
two micro-batches a step (no_sync holds back the first), three iterations, traced; small
buckets, so that the expert layer has several; all-reduce buckets, and ZeRO-1's reduce-scatter
ones with --overlap-param-gather. The losses equal the run without overlap's to 1e-6 (bit for
bit here; but a 4-rank gloo sum may add in another order when the buckets are cut differently).
"""

import json

import pytest

from distributed import pretrain_records
from minitron.launcher import LaunchConfig, RankFailure, Target, launch, session_env
from minitron.trace.reader import load_trace
from test_ddp_overlap import _ancestors   # a record's callers, innermost first

MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "1e-2",
       "--moe-token-dispatcher-type", "alltoall", "--expert-model-parallel-size", "2"]
MODEL = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
         "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "3", "--lr", "1e-2",
         "--mock-data", "--vocab-size", "127", "--make-vocab-size-divisible-by", "32",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7", "--distributed-backend", "gloo",
         "--disable-bias-linear", "--eval-iters", "0", *MOE]
OVERLAP = ["--overlap-grad-reduce", "--ddp-bucket-size", "300"]
MODES = {"allreduce": ([], "all_reduce"),
         "zero1": (["--use-distributed-optimizer", "--overlap-param-gather"], "reduce_scatter_tensor")}
WORLD = 4
EXPERT_GROUP = "EXPERT_DATA_PARALLEL_GROUP"
GROUP = "minitron.core.distributed.param_and_grad_buffer._ParamAndGradBucketGroup."


@pytest.fixture(scope="module", params=list(MODES))
def traced_run(request, tmp_path_factory):
    """Overlapped and traced: (losses, rank 0's records, the bucket collective's name)."""
    flags, collective = MODES[request.param]
    out = tmp_path_factory.mktemp("overlap-moe")
    argv = [*MODEL, *OVERLAP, *flags, "--log-jsonl", str(out / "it.jsonl")]
    config = LaunchConfig(world_size=WORLD, log_dir=out / "logs", env=session_env(WORLD, out / "trace"))
    try:
        launch(config, Target(module="minitron.pretrain_gpt", argv=argv))
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(30)}") from None
    losses = [json.loads(line)["lm_loss"] for line in open(out / "it.jsonl")]
    return losses, load_trace(out / "trace")[0], collective


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return [r["lm_loss"] for r in pretrain_records(tmp_path_factory.mktemp("plain") / "run", WORLD, MODEL)]


def test_expert_overlap_keeps_the_losses(plain, traced_run):
    assert traced_run[0] == pytest.approx(plain, abs=1e-6, rel=0)
    assert plain[-1] != plain[0]


def test_expert_buckets_are_reduced_from_backward(traced_run):
    _, records, collective = traced_run
    by_id = {r["id"]: r for r in records}
    steps = [r for r in records if r["name"].endswith("training.train_step")]
    assert len(steps) == 3

    def expert_reductions(step):
        return [r for r in records if r["name"] == "torch.distributed." + collective
                and r["args"].get("group") == EXPERT_GROUP and "start_grad_sync" in _ancestors(r, by_id)
                and step["start_us"] <= r["start_us"] <= step["end_us"]]

    # The first iteration counts the arrivals; its buckets are launched after backward.
    first = expert_reductions(steps[0])
    assert first and all("finalize_model_grads" in _ancestors(r, by_id) for r in first)
    for step in steps[1:]:
        launched = expert_reductions(step)
        assert len(launched) == len(first) > 1 and all(r["args"].get("async_op") for r in launched)
        # Each was launched by a parameter's hook inside the last micro-batch's backward,
        # before finalize_model_grads began: it only waits.
        assert all("backward_step" in _ancestors(r, by_id) for r in launched)
        assert not any("finalize_model_grads" in _ancestors(r, by_id) for r in launched)
        finalize = [r for r in records if r["name"].endswith("finalize_model_grads")
                    and step["start_us"] <= r["start_us"] <= step["end_us"]]
        assert len(finalize) == 1 and all(r["start_us"] < finalize[0]["start_us"] for r in launched)
        waits = [r for r in records if r["name"] == GROUP + "finish_grad_sync" and r["parent"] in by_id
                 and step["start_us"] <= r["start_us"] <= step["end_us"]]
        assert waits and all(r["args"]["in_flight"] for r in waits)
