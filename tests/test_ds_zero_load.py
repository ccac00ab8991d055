"""zero_optimization's two loading keys as DeepSpeed 0.19.8 acts on them, on 2 forked gloo ranks
(one launch): one bf16 Adam step, a save, loads into fresh engines.

* load_from_fp32_weights false (stages 1-2): the fp32 masters come back from the model's bf16
  weights, rounded, where by default they come back from the checkpoint's fp32 partitions.
* pipeline_loading_checkpoint (stage 3): rank 1 reads its file only after rank 0's word, a
  one-element send/recv, and loads the same numbers; below stage 3 the load refuses it.
"""
import pytest
import torch

from distributed import run_ranks
from minitron.trace.reader import load_trace

WORLD, IN = 2, 16
RUN = "zero_load.run"


def _engine(stage: int, **zero):
    from minitron.runtime import initialize
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(IN, IN), torch.nn.Tanh(), torch.nn.Linear(IN, IN))
    config = {"train_batch_size": 2 * WORLD, "bf16": {"enabled": True}, "zero_optimization": {"stage": stage, **zero},
              "optimizer": {"type": "Adam", "params": {"lr": 0.01}}}
    return initialize(model=net, config=config)[0]


def _runs(rank: int, root: str) -> dict:
    from minitron.trace import traced
    out = {}
    for stage in (2, 3):
        engine = _engine(stage)
        x = torch.randn(2, IN, generator=torch.Generator().manual_seed(rank)).bfloat16()
        engine.backward(engine(x).float().pow(2).mean())
        engine.step()
        engine.save_checkpoint(f"{root}/stage{stage}")
        out[f"saved{stage}"] = engine.optimizer.single_partition_of_fp32_groups[0].detach().clone()
    for name, stage, zero in (("fp32", 2, {}), ("bit16", 2, {"load_from_fp32_weights": False}),
                              ("pipeline", 3, {"pipeline_loading_checkpoint": True})):
        @traced(name=RUN, args=lambda name=name: {"case": name})
        def run():
            engine = _engine(stage, **zero)
            engine.load_checkpoint(f"{root}/stage{stage}")
            flat = engine.optimizer.bit16_groups_flat[0] if stage == 2 else None
            return engine.optimizer.single_partition_of_fp32_groups[0].detach().clone(), flat
        out[name] = run()
    try:
        _engine(2, pipeline_loading_checkpoint=True).load_checkpoint(f"{root}/stage2")
    except ValueError as err:
        out["refused"] = str(err)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("zero_load")
    results = run_ranks(lambda rank: _runs(rank, str(root)), world_size=WORLD, tp=None,
                        trace_dir=str(root / "trace"))
    return results, load_trace(root / "trace")


def test_masters_from_fp32_partitions_or_from_bf16_weights(runs):
    for rank, out in enumerate(runs[0]):
        (fp32, flat), (bit16, _) = out["fp32"], out["bit16"]
        assert torch.equal(fp32, out["saved2"])
        mine = flat.narrow(0, rank * fp32.numel(), fp32.numel())   # my partition of the bf16 weights
        assert torch.equal(bit16, mine.float())
        assert not torch.equal(bit16, fp32)   # an Adam step leaves bits below bf16's precision


def test_pipeline_loading_waits_for_the_previous_rank(runs):
    for out in runs[0]:
        assert torch.equal(out["pipeline"][0], out["saved3"])
        assert "only ZeRO stage 3 loads checkpoints in a pipeline" in out["refused"]
    for rank, records in runs[1].items():
        run = next(r for r in records if r["name"] == RUN and r["args"]["case"] == "pipeline")
        inside = [r["name"].rsplit(".", 1)[1] for r in records
                  if run["start_us"] <= r["start_us"] and r["end_us"] <= run["end_us"]
                  and r["name"] in ("torch.distributed.send", "torch.distributed.recv")]
        assert inside == (["send"] if rank == 0 else ["recv"])
