"""ZeRO's overlap_comm (runtime/zero/): the same numbers, the reductions launched in backward.

On 2 forked gloo ranks, one engine per (stage, overlap_comm), a toy MLP, two steps of two
micro-batches with small buckets. overlap_comm only moves *when* each reduction is waited
for, so every loss, gradient norm and final weight equals the run without it, bit for bit.
The trace shows the difference: with overlap_comm the stage 1 and 2 buckets are reduced with
async_op=True inside engine.backward (stage 1 in the boundary's backward only) and waited for
afterwards; at stage 3 (where DeepSpeed's default is on) each gradient's reduce-scatter is
launched in backward and waited for in reduce_gradients.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from distributed import run_ranks
from minitron.runtime import DeepSpeedConfig
from minitron.trace.reader import load_trace
from toy_models import toy_mlp

IN, OUT, BATCH, STEPS = 6, 3, 8, 2
CONFIG = {"train_batch_size": BATCH, "gradient_accumulation_steps": 2, "gradient_clipping": 0.05,
          "optimizer": {"type": "Adam", "params": {"lr": 0.02, "weight_decay": 0.01}}}
RUN = "zero_overlap.run"
BUCKETS = "minitron.runtime.zero.buckets.GradientBuckets."


def _body(rank):
    import torch.distributed as dist
    from minitron.runtime import initialize
    from minitron.trace import traced

    out = {}
    for stage in (1, 2, 3):
        for overlap in (False, True):
            @traced(name=RUN, args=lambda stage=stage, overlap=overlap: {"stage": stage, "overlap": overlap})
            def run():
                model = toy_mlp(0, IN, OUT)
                engine, *_ = initialize(model=model, model_parameters=model.parameters(), config={
                    **CONFIG, "zero_optimization": {"stage": stage, "reduce_bucket_size": 40, "overlap_comm": overlap}})
                losses, norms = [], []
                for step in range(STEPS):
                    g = torch.Generator().manual_seed(100 + step)
                    x, y = torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)
                    for k in range(2):
                        rows = slice((2 * k + rank) * 2, (2 * k + rank + 1) * 2)
                        losses.append(engine.backward(torch.nn.functional.mse_loss(engine(x[rows]), y[rows])).item())
                        engine.step()
                    norms.append(engine.optimizer._global_grad_norm)
                if stage == 3:   # the weights live in pieces: gather them to compare
                    engine.optimizer.gather(list(model.parameters()))
                weights = [p.detach().clone() for p in model.parameters()]
                return losses, norms, weights
            out[(stage, overlap)] = run()
    assert dist.get_world_size() == 2
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp("zero-overlap")
    results = run_ranks(_body, world_size=2, trace_dir=str(trace_dir))
    return results, load_trace(trace_dir)[0]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_overlap_comm_keeps_the_numbers(runs, stage):
    for ranks in runs[0]:
        (losses, norms, weights), (o_losses, o_norms, o_weights) = ranks[(stage, False)], ranks[(stage, True)]
        assert o_losses == losses and o_norms == norms
        assert all(torch.equal(a, b) for a, b in zip(weights, o_weights))


def _within(records, run):
    return [r for r in records if run["start_us"] <= r["start_us"] and r["end_us"] <= run["end_us"]]


def _ancestors(record, by_id):
    names = []
    while record.get("parent") in by_id:
        record = by_id[record["parent"]]
        names.append(record["name"])
    return names


def test_trace_shows_where_the_reductions_went(runs):
    records = runs[1]
    by_id = {r["id"]: r for r in records}
    run_of = {(r["args"]["stage"], r["args"]["overlap"]): r for r in records if r["name"] == RUN}
    backward = "minitron.runtime.engine.DeepSpeedEngine.backward"
    for stage in (1, 2):
        launched = [r for r in _within(records, run_of[(stage, True)]) if r["name"] == BUCKETS + "reduce"
                    and r["args"]["params"]]
        assert launched and all(r["args"]["async"] for r in launched)
        # Launched by the gradient hooks, inside backward; stage 1 only in the boundary's.
        inside = [r for r in launched if backward in _ancestors(r, by_id)]
        boundaries = {by_id[r["parent"]]["args"]["boundary"] for r in inside if r["parent"] in by_id
                      and by_id[r["parent"]]["name"] == backward}
        assert inside and (stage == 2 or boundaries == {True})
        waits = [r for r in _within(records, run_of[(stage, True)]) if r["name"] == BUCKETS + "_wait"]
        assert len(waits) == len(launched)
        # Without overlap_comm nothing is left in flight.
        plain = _within(records, run_of[(stage, False)])
        assert not any(r["name"] == BUCKETS + "_wait" for r in plain)
        assert not any(r.get("args", {}).get("async_op") for r in plain)
    stage3 = [r for r in _within(records, run_of[(3, True)]) if r["name"].startswith("torch.distributed.reduce_scatter")]
    assert stage3 and all(r["args"].get("async_op") for r in stage3)


# --- against DeepSpeed 0.19.8 (marked deepspeed) ----------------------------------------------
PROBE = """
import json
from deepspeed.comm.torch import TorchBackend
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
out = {}
for stage in (0, 1, 2, 3):
    for given in (None, True, False):
        zero = {"stage": stage, **({} if given is None else {"overlap_comm": given})}
        out[f"{stage} {given}"] = DeepSpeedZeroConfig(**zero).overlap_comm
# What TorchBackend.has_all_gather_into_tensor() answers once initialised (asked without starting
# a world: init_distributed would build DeepSpeed's shared-memory op first, a minute of compiling).
out["has_all_gather_into_tensor"] = TorchBackend.get_all_gather_function() is not None
print(json.dumps(out))
"""


@pytest.mark.deepspeed
def test_deepspeed_resolves_and_gathers_the_same():
    """overlap_comm resolves as DeepSpeed's validator resolves it, at every stage, given or not;
    and DeepSpeed's comm has all_gather_into_tensor, so its all_gather_dp_groups never reads
    allgather_bucket_size (one call per flat group), which is why minitron accepts and ignores it.
    DeepSpeed runs in a child process: the tests' parent, which forks the ranks, stays free of it."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed: DS_BUILD_OPS=0 pip install --no-deps deepspeed==0.19.8")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0"}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs.pop("has_all_gather_into_tensor") is True
    for key, overlap in theirs.items():
        stage, given = key.split()
        zero = {"stage": int(stage), **({} if given == "None" else {"overlap_comm": given == "True"})}
        mine = DeepSpeedConfig({"train_batch_size": 8, "zero_optimization": zero}).zero_config.overlap_comm
        assert mine == overlap, key
