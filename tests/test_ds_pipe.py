"""DeepSpeed's pipeline (minitron/runtime/pipe/): the instruction streams of TrainSchedule and
InferenceSchedule for a small case written out by hand, the partitioning by hand, and
``pretrain --deepspeed`` at pipeline size 2 (data-parallel 1 and 2) losing exactly what the
serial run loses, with the executed stream recorded on the trace equal to the schedule's; and
(marked deepspeed) the same streams, partitions and topologies held against DeepSpeed 0.19.8's
own classes for many (micro_batches, stages, stage_id).
"""

import importlib
import json
import re

import pytest

from deepspeed_child import answer_in_child, needs_deepspeed
from distributed import pretrain_records

from minitron.runtime.pipe.partition import partition_balanced, partition_uniform
from minitron.runtime.pipe.schedule import InferenceSchedule, TrainSchedule
from minitron.runtime.pipe.topology import PipeDataParallelTopology, PipeModelDataParallelTopology

SHORT = {"LoadMicroBatch": "L", "ForwardPass": "F", "BackwardPass": "B", "SendActivation": "SA",
         "RecvActivation": "RA", "SendGrad": "SG", "RecvGrad": "RG", "ReduceTiedGrads": "RT",
         "ReduceGrads": "RD", "OptimizerStep": "OS"}


def short(schedule) -> list[str]:
    """A stream as one string per step: 'RA0 L0 F0' = RecvActivation(0), LoadMicroBatch(0), ..."""
    return [" ".join(SHORT[c.name] + str(c.kwargs.get("buffer_id", "")) for c in step) for step in schedule]


def test_train_schedule_two_stages_two_micro_batches_by_hand():
    """2 micro-batches, 2 stages: 2 x (2 + 2 - 1) = 6 steps. Stage 0 runs forwards on even steps,
    stage 1 on odd ones; each send meets the neighbour's receive in the same step."""
    assert short(TrainSchedule(2, 2, 0)) == [
        "L0 F0",          # step 0: micro-batch 0 in
        "SA0",            # step 1 (a backward step, nothing to run back yet): its activation out
        "L1 F1",          # step 2
        "RG0 SA1 B0",     # step 3: micro-batch 0's gradient in, micro-batch 1's activation out
        "",               # step 4: no third micro-batch
        "RG1 B1 RT RD OS",   # step 5: the last backward, then reduce and step
    ]
    assert short(TrainSchedule(2, 2, 1)) == [
        "",               # step 0: nothing has arrived
        "RA0 L0 F0",      # step 1: activation 0 in (and its labels), forward and loss
        "B0",             # step 2: backward right away: the last stage holds one in flight
        "SG0 RA1 L1 F1",  # step 3: gradient 0 upstream, activation 1 in
        "B1",
        "SG1 RT RD OS",
    ]


def test_buffer_counts_by_hand():
    """Forwards in flight at stage s: stages - s, no more than the micro-batches, at least 2."""
    assert [TrainSchedule(4, 3, s).num_pipe_buffers() for s in range(3)] == [3, 2, 2]
    assert [TrainSchedule(8, 4, s).num_pipe_buffers() for s in range(4)] == [4, 3, 2, 2]
    assert TrainSchedule(1, 4, 0).num_pipe_buffers() == 2
    assert InferenceSchedule(8, 4, 0).num_pipe_buffers() == 2


def test_inference_schedule_by_hand():
    """Forward only: 2 + 2 - 1 = 3 steps, one stage late each; two buffers alternate, the even
    stage sending from the one it is not receiving into."""
    assert short(InferenceSchedule(2, 2, 0)) == ["L0 F0", "L1 SA0 F1", "SA1"]
    assert short(InferenceSchedule(2, 2, 1)) == ["", "L0 RA0 F0", "L1 RA1 F1"]


def test_partitions_by_hand():
    assert partition_uniform(5, 2) == [0, 3, 5]
    assert partition_uniform(2, 4) == [0, 1, 2, 2, 2]
    # A heavy embedding and head around four light layers: balance puts them apart.
    assert partition_balanced([100, 1, 1, 1, 1, 100], 2) == [0, 3, 6]
    # type:<regex> weighs the matching layers 1: the transformer layers split 2 and 2.
    assert partition_balanced([0, 1, 1, 1, 1, 0, 0], 2) == [0, 3, 7]


def test_topology_axis_order():
    """Data innermost without tensor parallelism; with it, (pipe, data, model): Megatron's order."""
    topo = PipeDataParallelTopology(num_pp=2, num_dp=2)
    assert topo.get_axis_comm_lists("data") == [[0, 1], [2, 3]]
    assert topo.get_axis_comm_lists("pipe") == [[0, 2], [1, 3]]
    topo = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    assert topo.get_axis_comm_lists("model") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo.get_axis_comm_lists("pipe") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert topo.get_coord(5)._asdict() == {"pipe": 1, "data": 0, "model": 1}


# --- pretrain --deepspeed with a pipeline ---------------------------------------------------------

MODEL = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "127", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo", "--eval-interval", "2", "--eval-iters", "1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The serial run and pp 2 x dp 1 (traced) and pp 2 x dp 2, through the PipelineEngine at ZeRO-1."""
    root = tmp_path_factory.mktemp("dspipe")
    config = root / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1,
                                  "gradient_clipping": 1.0, "zero_optimization": {"stage": 1}}))
    flags = ["--pipeline-model-parallel-size", "2", "--deepspeed", "--deepspeed-config", str(config)]
    # One rank alone would start a thread per core; on a shared machine the second only waits.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")
        serial = pretrain_records(root / "serial", 1, MODEL)
    return {"root": root, "serial": serial,
            "pp2-dp1": pretrain_records(root / "pp2", 2, [*MODEL, *flags], trace_dir=root / "trace"),
            "pp2-dp2": pretrain_records(root / "pp2dp2", 4, [*MODEL, *flags]),
            "trace": root / "trace"}


@pytest.mark.parametrize("layout", ["pp2-dp1", "pp2-dp2"])
def test_pipeline_engine_matches_serial(runs, layout):
    serial, records = runs["serial"], runs[layout]
    losses = [r["lm_loss"] for r in records]
    assert losses == pytest.approx([r["lm_loss"] for r in serial], abs=1e-5)
    assert [r["grad_norm"] for r in records] == pytest.approx([r["grad_norm"] for r in serial], rel=1e-4)
    assert losses[-1] != losses[0]   # the weights moved


def _validation_loss(log_dir) -> float:
    """The loss the last rank printed for the evaluation after iteration 2."""
    last = max(log_dir.glob("rank*.log"), key=lambda p: int(p.stem[4:]))
    return float(re.search(r"validation loss at iteration 2 \| lm loss value: (\S+)", last.read_text()).group(1))


def test_evaluation_runs_the_inference_schedule(runs):
    """--eval-interval through eval_batch (InferenceSchedule): the serial run's validation loss."""
    root = runs["root"]
    expected = _validation_loss(root / "serial" / "logs")
    for name in ("pp2", "pp2dp2"):
        assert _validation_loss(root / name / "logs") == pytest.approx(expected, abs=1e-5), name


def test_the_trace_holds_the_executed_stream(runs):
    """Each stage's traced instructions, step by step, are TrainSchedule's for that stage."""
    from minitron.cli.views.schedule_deepspeed import deepspeed_streams, instruction_name   # the view's reader
    from minitron.trace.reader import load_trace   # only this test reads a trace

    streams = deepspeed_streams(load_trace(runs["trace"]))
    assert sorted(streams) == [0, 1]
    for stage, records in streams.items():
        executed = [(r["args"]["step"], instruction_name(r), r["args"]["buffer_id"]) for r in records]
        expected = [(step, c.name, c.kwargs.get("buffer_id")) for step, cmds in enumerate(TrainSchedule(4, 2, stage))
                    for c in cmds]
        assert executed == expected, stage
    # ...and the view draws them as a step grid: stage 0 waits out step 1 (it only sends).
    from minitron.cli.views.schedule_deepspeed import render_steps   # the view under test
    rows = [line.rstrip() for line in render_steps(streams).plain.splitlines()[:2]]
    assert rows == ["stage 0 F0 ·  F1 B0 F2 B1 F3 B2 ·  B3", "stage 1 ·  F0 B0 F1 B1 F2 B2 F3 B3 ·"]


def test_megatron_1f1b_order_beside_it():
    """Megatron's order per stage, from its warm-up count: stage 0 of 2 runs one forward ahead."""
    from minitron.cli.views.schedule_deepspeed import megatron_1f1b_order   # the view under test

    order = megatron_1f1b_order(2, 4)
    label = {"minitron.core.pipeline_parallel.schedules.forward_step": "F",
             "minitron.core.pipeline_parallel.schedules.backward_step": "B"}
    as_text = {stage: " ".join(label[s["name"]] + str(s["args"]["microbatch"]) for s in steps)
               for stage, steps in order.items()}
    assert as_text == {0: "F0 F1 B0 F2 B1 F3 B2 B3", 1: "F0 B0 F1 B1 F2 B2 F3 B3"}


# --- against DeepSpeed 0.19.8 ----------------------------------------------------------------------

CASES = [(m, s, sid) for m in (1, 2, 3, 4, 7, 8) for s in (1, 2, 3, 4, 5) for sid in range(s)]


def streams(module: str) -> dict:
    """Every case's TrainSchedule and InferenceSchedule streams and buffer counts, some
    partitions and topologies, from ``module`` (ours or DeepSpeed's), as JSON."""
    pipe = importlib.import_module(module + ".schedule")
    out = {}
    for m, s, sid in CASES:
        for kind in ("TrainSchedule", "InferenceSchedule"):
            sched = getattr(pipe, kind)(m, s, sid)
            out[f"{kind} {m} {s} {sid}"] = [[[c.name, c.kwargs] for c in step] for step in sched] + [
                sched.num_pipe_buffers()]
    utils = importlib.import_module("deepspeed.runtime.utils" if module.startswith("deepspeed")
                                    else module + ".partition")
    weights = [[3, 0, 5, 5, 5, 9, 1], [1000, 12, 12, 12, 12, 12, 12, 1000], [0, 1, 1, 1, 0, 0], [7, 7]]
    out["balanced"] = [[int(x) for x in utils.partition_balanced(w, p)] for w in weights for p in (1, 2, 3, 4)]
    out["uniform"] = [utils.partition_uniform(n, p) for n in range(1, 10) for p in (1, 2, 3, 4)]
    topo = importlib.import_module(module + ".topology")
    t = topo.PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=3)
    out["topology"] = {axis: t.get_axis_comm_lists(axis) for axis in ("pipe", "data", "model")}
    return out


@needs_deepspeed
def test_same_streams_as_deepspeed():
    theirs = answer_in_child("test_ds_pipe", "streams", "deepspeed.runtime.pipe")
    ours = json.loads(json.dumps(streams("minitron.runtime.pipe")))
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert ours[key] == theirs[key], key
