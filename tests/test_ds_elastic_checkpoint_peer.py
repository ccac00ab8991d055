"""zero_optimization.elastic_checkpoint held against the real DeepSpeed 0.19.8 (the ``peer``
extra), ZeRO stage 2 in fp32 with DeepSpeed's default Adam, on 2 gloo ranks:

* both write the optimizer files with the same keys, base_optimizer_state a list of one dict per
  group with the same keys and the same lean tensor shapes;
* DeepSpeed's engine (elastic_checkpoint on) loads minitron's checkpoint and runs the next two
  steps as minitron's uninterrupted run does, and minitron's engine does the same with DeepSpeed's;
* minitron loads DeepSpeed's dp-2 checkpoint at dp 1: its moments are DeepSpeed's lean
  partitions glued, bit for bit (DeepSpeed's own engine refuses another dp size when it loads
  optimizer states, elastic_checkpoint.py says).

The parent process never imports DeepSpeed (test_ds_peer.py says why): it runs in forked ranks.
"""

import os

import pytest
import torch

from distributed import run_ranks
from minitron.runtime.checkpoint.pickles import load_state
from test_ds_checkpoint import NEXT, TiedNet, ds_config, train
from deepspeed_child import NEEDS_DEEPSPEED

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it

OPTIM = "global_step2/zero_pp_rank_{}_mp_rank_00_optim_states.pt"


def _config() -> dict:
    """test_ds_checkpoint's config without its WarmupLR: an elastic file keeps no param groups,
    and DeepSpeed's scheduler, unlike minitron's, does not write its lr back when it loads, so
    DeepSpeed's first resumed step would run at a fresh scheduler's lr (0.0 here) and part from
    the uninterrupted run, whichever engine wrote the file. A constant lr keeps the two comparable."""
    config = ds_config(2, "fp32")
    config["zero_optimization"]["elastic_checkpoint"] = True
    del config["scheduler"]
    return config


def _both(root: str):
    def body(rank):
        import deepspeed   # only in the ranks
        from minitron.runtime import initialize
        out = {}
        for name, make in (("minitron", initialize), ("deepspeed", deepspeed.initialize)):
            engine, *_ = make(model=TiedNet(), config=_config())
            train(engine, rank, "fp32", range(2))
            engine.save_checkpoint(f"{root}/{name}")
            out[name] = train(engine, rank, "fp32", NEXT)
        for name, make, source in (("deepspeed_from_minitron", deepspeed.initialize, "minitron"),
                                   ("minitron_from_deepspeed", initialize, "deepspeed")):
            fresh, *_ = make(model=TiedNet(seed=9), config=_config())
            fresh.load_checkpoint(f"{root}/{source}")
            out[name] = train(fresh, rank, "fp32", NEXT)
        return out
    return body


def _alone(root: str):
    def body(rank):
        from minitron.runtime import initialize
        engine, *_ = initialize(model=TiedNet(seed=9), config=_config())
        engine.load_checkpoint(f"{root}/deepspeed")
        opt = engine.optimizer
        state = opt.optimizer.state[opt.optimizer.param_groups[0]["params"][0]]
        return {k: state[k].clone() for k in ("exp_avg", "exp_avg_sq")}
    return body


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic_peer")
    both = run_ranks(_both(str(root)), world_size=2, tp=None)
    return root, both, run_ranks(_alone(str(root)), world_size=1, tp=None)[0]


def _layout(file) -> dict:
    state = load_state(file)["optimizer_state_dict"]
    lean = state["base_optimizer_state"]
    return {"keys": list(state), "groups": [{k: tuple(v.shape) if torch.is_tensor(v) else type(v).__name__
                                             for k, v in group.items()} for group in lean]}


def test_the_files_have_deepspeeds_layout(runs):
    root = runs[0]
    for rank in range(2):
        ours, theirs = (_layout(root / who / OPTIM.format(rank)) for who in ("minitron", "deepspeed"))
        assert ours == theirs


def test_each_engine_resumes_the_others_elastic_checkpoint(runs):
    for out in runs[1]:
        # the same arithmetic on both sides (test_ds_peer.py's tolerance)
        assert out["deepspeed_from_minitron"] == pytest.approx(out["minitron"], rel=1e-6)
        assert out["minitron_from_deepspeed"] == pytest.approx(out["deepspeed"], rel=1e-6)


def test_deepspeeds_file_re_cut_at_dp_1(runs):
    root, _, alone = runs
    files = [load_state(root / "deepspeed" / OPTIM.format(r))["optimizer_state_dict"] for r in range(2)]
    for key in ("exp_avg", "exp_avg_sq"):
        glued = torch.cat([f["base_optimizer_state"][0][key] for f in files])
        assert torch.equal(alone[key][:glued.numel()], glued)
        assert not alone[key][glued.numel():].any()   # dp 1's own padding
