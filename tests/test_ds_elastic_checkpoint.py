"""zero_optimization.elastic_checkpoint (ZeRO stage 2, fp32 Adam): two steps at dp 2, a save, and
the run resumed at dp 4, dp 1 and dp 2 (rigidly, elastic_checkpoint off), against the run that
went on at dp 2 without stopping. Every dp size sees the same global batch of 4 rows each step,
split by rank, so only the order of the gradient sum changes with the dp size.

The model has 493 elements, so dp 2's last partition carries 3 elements of padding: the elastic
file cuts them off, and dp 4 and dp 1 pad the glued whole again their own way.
"""
import pytest
import torch

from distributed import run_ranks

IN, OUT, BATCH, SAVE_AT, STEPS = 16, 13, 4, 2, 4


def _engine(elastic: bool):
    from minitron.runtime import initialize
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(IN, IN), torch.nn.Tanh(), torch.nn.Linear(IN, OUT))
    config = {"train_batch_size": BATCH, "zero_optimization": {"stage": 2, "elastic_checkpoint": elastic},
              "optimizer": {"type": "Adam", "params": {"lr": 0.01}}, "gradient_clipping": 0.0}
    return initialize(model=net, config=config)[0]


def _batch(step: int) -> torch.Tensor:
    return torch.randn(BATCH, IN, generator=torch.Generator().manual_seed(step))


def _train(engine, steps, rank: int, dp: int) -> list:
    """Full-batch losses before each step (the same number on every rank)."""
    losses, rows = [], BATCH // dp
    for step in steps:
        x = _batch(step)
        with torch.no_grad():
            losses.append(engine(x).pow(2).mean().item())
        engine.backward(engine(x[rank * rows:(rank + 1) * rows]).pow(2).mean())
        engine.step()
    return losses


def _snapshot(engine) -> dict:
    opt = engine.optimizer
    state = opt.optimizer.state[opt.optimizer.param_groups[0]["params"][0]]
    return {"weights": [p.detach().clone() for p in engine.module.parameters()],
            "exp_avg": state["exp_avg"].clone(), "exp_avg_sq": state["exp_avg_sq"].clone()}


def _saving(rank: int, root: str) -> dict:
    from minitron.runtime.checkpoint.pickles import load_state
    out = {}
    for elastic, name in ((True, "elastic"), (False, "rigid")):
        engine = _engine(elastic)
        _train(engine, range(SAVE_AT), rank, 2)
        engine.save_checkpoint(f"{root}/{name}")
        if elastic:
            out["saved"] = _snapshot(engine)
            out["losses"] = _train(engine, range(SAVE_AT, STEPS), rank, 2)
            out["after"] = _snapshot(engine)["weights"]
            file = load_state(f"{root}/elastic/global_step{SAVE_AT}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
            out["file"] = {k: v for k, v in file["optimizer_state_dict"].items() if k != "loss_scaler"}
    rigid = _engine(False)   # the elastic file read at the same dp size, without elastic_checkpoint
    rigid.load_checkpoint(f"{root}/elastic")
    out["rigid_loaded"] = _snapshot(rigid)
    out["rigid_losses"] = _train(rigid, range(SAVE_AT, STEPS), rank, 2)
    return out


def _resuming(rank: int, root: str, dp: int) -> dict:
    engine = _engine(True)
    engine.load_checkpoint(f"{root}/elastic")
    out = {"loaded": _snapshot(engine), "steps": engine.global_steps}
    out["losses"] = _train(engine, range(SAVE_AT, STEPS), rank, dp)
    out["after"] = _snapshot(engine)["weights"]
    for elastic, name in ((True, "rigid"), (False, "elastic")):
        try:
            _engine(elastic).load_checkpoint(f"{root}/{name}")
        except ValueError as err:
            out[f"refused_{name}"] = str(err)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("elastic"))
    saved = run_ranks(lambda rank: _saving(rank, root), world_size=2, tp=None)
    return saved, {dp: run_ranks(lambda rank, dp=dp: _resuming(rank, root, dp), world_size=dp, tp=None)
                   for dp in (4, 1)}


def _glued(outs: list, key: str) -> torch.Tensor:
    """A moment's dp partitions end to end, cut to the model's elements (the rest is padding)."""
    return torch.cat([o["loaded" if "loaded" in o else "saved"][key] for o in outs])[:IN * IN + IN + IN * OUT + OUT]


def test_the_file_holds_lean_moments_per_group_and_the_step_apart(runs):
    saved, _ = runs
    files = [out["file"] for out in saved]
    for rank, f in enumerate(files):
        lean = f["base_optimizer_state"]
        assert isinstance(lean, list) and len(lean) == 1   # one dict per param group, not a state dict
        assert lean[0]["exp_avg"].shape == f["single_partition_of_fp32_groups"][0].shape
        assert f["base_optimizer_state_step"] == 0   # FusedAdam's group place-holder; counts are per state
        assert lean[0]["step"] == SAVE_AT
    assert [f["group_paddings"] for f in files] == [[0], [3]]
    assert files[1]["base_optimizer_state"][0]["exp_avg"].numel() == 248 - 3


@pytest.mark.parametrize("dp", [4, 1])
def test_another_dp_size_resumes_the_same_numbers(runs, dp):
    saved, resumed = runs
    outs = resumed[dp]
    assert len(outs) == dp and all(o["steps"] == SAVE_AT for o in outs)
    for key in ("exp_avg", "exp_avg_sq"):   # a copy, cut anew: bit for bit
        assert torch.equal(_glued(outs, key), _glued(saved, key))
    for out in outs:
        assert all(torch.equal(a, b) for a, b in zip(out["loaded"]["weights"], saved[0]["saved"]["weights"]))
        # the gradient's all-reduce sums dp terms in another order: fp32 rounding (measured: the
        # losses equal, the weights after two steps within 1.5e-8), held to 1e-6
        assert out["losses"] == pytest.approx(saved[0]["losses"], rel=1e-6)
        assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(out["after"], saved[0]["after"]))
    assert saved[0]["losses"][0] != saved[0]["losses"][1]   # the steps after the load do move the model


def test_an_elastic_file_loads_rigidly_at_its_own_dp_size(runs):
    saved, _ = runs
    for out in saved:
        for key in ("exp_avg", "exp_avg_sq"):   # own lean moments padded back: the running run's
            assert torch.equal(out["rigid_loaded"][key], out["saved"][key])
        assert out["rigid_losses"] == out["losses"]   # the same dp size: the same sums, bit for bit


def test_what_cannot_be_cut_anew_is_refused(runs):
    _, resumed = runs
    out = resumed[4][0]
    assert "saved at ZeRO stage 2 with 2 partitions" in out["refused_rigid"]   # a rigid file: padded moments
    # without the key the model file's owner record already refuses the other dp size
    assert "data-parallel-size 2, not this run's 4" in out["refused_elastic"]


def test_parameter_alignment_is_refused_where_deepspeed_reads_it():
    from minitron.runtime.config import DeepSpeedConfig
    from minitron.runtime.config_values import DeepSpeedConfigError

    def config(stage):
        return {"train_batch_size": 4, "zero_optimization": {"stage": stage, "parameter_alignment": True}}
    for stage in (1, 2):   # DeepSpeedZeroOptimizer pads parameters to 16 bytes: not built
        with pytest.raises(DeepSpeedConfigError, match="16-byte boundary"):
            DeepSpeedConfig(config(stage), world_size=2)
    for stage in (0, 3):   # read by no DeepSpeed code there: accepted, and ds-config says why
        notes = DeepSpeedConfig(config(stage), world_size=2).as_dict()["no_effect"]
        assert "no DeepSpeed code reads it" in notes["zero_optimization.parameter_alignment"]
