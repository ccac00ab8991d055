"""test_ds_precision_options.py's cases held against the real DeepSpeed 0.19.8's engine, on its CPU
accelerator, in the same forked gloo ranks: for each bf16/fp16 case, whether a NaN gradient's step
is taken (the weights NaN) or skipped (the weights untouched) is the same in both engines; and
fp16.auto_cast hands the module the same dtypes (fp16 itself left off: DeepSpeed's CPU
accelerator runs no fp16 engine, and auto_cast casts without it).
"""
import os

import torch

from deepspeed_child import NEEDS_DEEPSPEED
from distributed import run_ranks
from test_ds_precision_options import CASES, Recorder, _config

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it

PEER_CASES = {name: case for name, case in CASES.items() if "fp16" not in case[0]}   # no fp16 engine on CPU


def _both(rank):
    import math

    import deepspeed
    from minitron.runtime import initialize

    torch.set_num_threads(1)
    out = {}
    for who, init in (("minitron", initialize), ("deepspeed", deepspeed.initialize)):
        for name, (precision, stage, _) in PEER_CASES.items():
            engine, *_ = init(model=Recorder(), config=_config(precision, stage))
            engine.backward(engine(torch.full((4,), math.nan)))
            engine.step()
            w = engine.module.w.detach().float()
            out[who, name] = (bool(w.isnan().all()), bool((w == 1).all()))
        engine, *_ = init(model=Recorder(), config=_config({"fp16": {"enabled": False, "auto_cast": True}}, 0))
        engine(torch.ones(4), extra=[torch.ones(1)])
        engine(torch.ones(4, dtype=torch.int64))
        out[who, "auto_cast"] = engine.module.seen
    return {f"{who}|{name}": value for (who, name), value in out.items()}


def test_deepspeed_steps_and_casts_the_same():
    results = run_ranks(_both, world_size=2, tp=None)
    for rank in results:
        for name, (_, _, taken) in PEER_CASES.items():
            assert rank[f"minitron|{name}"] == rank[f"deepspeed|{name}"] == (taken, not taken), name
        assert rank["minitron|auto_cast"] == rank["deepspeed|auto_cast"]
