"""optimizer.type and scheduler.type beyond DeepSpeed's own Adam/Lamb and five schedules
(runtime/basic_optimizer.py, runtime/torch_schedules.py, ops/lion, ops/adagrad): which configs
load and which are refused before any rank starts, the two ops' arithmetic, and one engine run
whose torch optimizer and torch schedule step as torch's own do. The peer test
(test_ds_optimizer_types_peer.py) holds the same against DeepSpeed 0.19.8."""
import pytest
import torch

from distributed import run_ranks
from minitron.ops.adagrad import DeepSpeedCPUAdagrad
from minitron.ops.lion import DeepSpeedCPULion, FusedLion
from minitron.runtime import DeepSpeedConfig
from minitron.runtime.config_values import DeepSpeedConfigError

BASE = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1}


def _config(optimizer=None, scheduler=None, **extra):
    config = {**BASE, **extra, **({"optimizer": optimizer} if optimizer else {})}
    return DeepSpeedConfig({**config, **({"scheduler": scheduler} if scheduler else {})}, world_size=2)


@pytest.mark.parametrize("kind", ["Adagrad", "adagrad", "Lion", "LION", "RMSprop", "Adamax", "NAdam", "RAdam",
                                  "Adadelta", "ASGD", "Rprop"])
def test_deepspeed_and_torch_optimizer_types_load(kind):
    spelled = {"adagrad": "Adagrad", "lion": "Lion"}.get(kind.lower(), kind)   # DeepSpeed's own: any case
    assert _config({"type": kind, "params": {"lr": 0.01}}).optimizer_name == spelled


@pytest.mark.parametrize("optimizer, words", [
    ({"type": "rmsprop"}, "write 'RMSprop'"),                        # torch's are looked up as written
    ({"type": "Sophia"}, "neither DeepSpeed's own"),
    ({"type": "RMSprop", "params": {"lr": -1}}, "Invalid learning rate"),   # torch's constructor, before ranks
    ({"type": "RMSprop", "params": {"betas": [0.9, 0.99]}}, "unexpected keyword argument 'betas'"),
    ({"type": "LBFGS"}, "needs a closure"),
    ({"type": "MuAdam"}, "pip install mup"),
    ({"type": "Muon", "params": {"per_head_muon": True}}, "per_head_muon true is not built"),   # Muon: stage 0, fp32
])
def test_refusals_name_the_cause(optimizer, words):
    with pytest.raises(DeepSpeedConfigError, match=words.replace("(", r"\(")):
        _config(optimizer)


def test_zero_runs_adagrad_and_lion_untested_others_only_when_allowed():
    for kind in ("Adagrad", "Lion"):   # in DeepSpeed's ZERO_SUPPORTED_OPTIMIZERS
        _config({"type": kind}, zero_optimization={"stage": 1})
    with pytest.raises(DeepSpeedConfigError, match="zero_allow_untested_optimizer"):
        _config({"type": "RMSprop"}, zero_optimization={"stage": 1})


def test_torch_schedules_load_in_fp32_without_zero_only():
    sched = {"type": "StepLR", "params": {"step_size": 10}}
    assert _config(scheduler=sched).scheduler_params == {"step_size": 10}
    for extra in ({"zero_optimization": {"stage": 1}}, {"bf16": {"enabled": True}}, {"fp16": {"enabled": True}}):
        with pytest.raises(DeepSpeedConfigError, match="is not an Optimizer"):   # DeepSpeed's TypeError
            _config(scheduler=sched, **extra)
    for bad, words in (({"type": "steplr"}, "write 'StepLR'"), ({"type": "ReduceLROnPlateau"}, "metric"),
                       ({"type": "StepLR"}, "step_size")):
        with pytest.raises(DeepSpeedConfigError, match=words):
            _config(scheduler=bad)


def test_lion_moves_every_element_by_lr_in_the_sign_of_its_blend():
    torch.manual_seed(0)
    w0, m0, g = torch.randn(50), torch.randn(50), torch.randn(50)
    g[0], m0[0] = 0.0, 0.0   # a zero blend: the kernel's copysign moves it by -lr (torch.sign would not)
    for cls in (DeepSpeedCPULion, FusedLion):
        p = torch.nn.Parameter(w0.clone())
        opt = cls([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
        opt.state[p].update(step=0, exp_avg=m0.clone())
        p.grad = g.clone()
        opt.step()
        c = (0.9 * m0.double() + 0.1 * g.double())
        sign = torch.where(c >= 0, 1.0, -1.0).double()
        # float32 arithmetic against float64: a few ulps
        torch.testing.assert_close(p.detach().double(), w0.double() * (1 - 0.05) - 0.1 * sign, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(opt.state[p]["exp_avg"].double(), 0.99 * m0.double() + 0.01 * g.double(),
                                   rtol=1e-6, atol=1e-6)
        # DeepSpeedCPULion's state also holds the zero second moment it never reads; FusedLion's does not
        assert ("exp_avg_sq" in opt.state[p]) == (cls is DeepSpeedCPULion) or not opt.state[p].get("exp_avg_sq", 0)


def test_cpu_adagrad_is_torch_adagrad_at_lr_decay_zero():
    torch.manual_seed(1)
    a, b = torch.nn.Parameter(torch.randn(40)), None
    b = torch.nn.Parameter(a.detach().clone())
    ours, theirs = DeepSpeedCPUAdagrad([a], lr=0.05, weight_decay=0.1), torch.optim.Adagrad([b], lr=0.05,
                                                                                            weight_decay=0.1)
    for _ in range(3):
        g = torch.randn(40)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    # the same float32 formula; torch's addcdiv rounds in its own order: a last-bit difference
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ours.state[a]["exp_avg_sq"], theirs.state[b]["sum"], rtol=1e-6, atol=1e-7)


def _engine_run(rank):
    from minitron.runtime import initialize
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    ref = torch.nn.Linear(4, 3)
    ref.load_state_dict(model.state_dict())
    config = {"train_batch_size": 2, "gradient_clipping": 0.0, "optimizer": {"type": "RMSprop", "params": {
        "lr": 0.01, "momentum": 0.5}}, "scheduler": {"type": "StepLR", "params": {"step_size": 1, "gamma": 0.5}}}
    engine, *_ = initialize(model=model, config=config)
    opt = torch.optim.RMSprop(ref.parameters(), lr=0.01, momentum=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    lrs = []
    for step in range(3):
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(step))   # both ranks: the same batch
        engine.backward(engine(x[rank:rank + 1]).square().mean())
        engine.step()
        (ref(x[0:1]).square().mean() / 2 + ref(x[1:2]).square().mean() / 2).backward()   # dp 2's mean
        opt.step()
        opt.zero_grad()
        sched.step()
        lrs.append(engine.get_lr()[0])
    return {"lrs": lrs, "basic": type(engine.basic_optimizer).__name__,
            "diff": max((p - q).abs().max().item() for p, q in zip(engine.module.parameters(), ref.parameters()))}


@pytest.fixture(scope="module")
def engine_run():
    return run_ranks(_engine_run, world_size=2, tp=None)


def test_engine_steps_torch_optimizer_and_schedule_as_torch_does(engine_run):
    for rank in (0, 1):
        assert engine_run[rank]["basic"] == "RMSprop"
        assert engine_run[rank]["lrs"] == [0.005, 0.0025, 0.00125]   # StepLR halving after each applied step
        # the engine averages the two ranks' gradients (a sum then a halving): a last-bit difference
        assert engine_run[rank]["diff"] < 1e-6
