"""The ds_config's other optimizers, as DeepSpeed 0.19.8 builds them: torch's SGD (any torch.optim
name, looked up as written), FusedLamb (ops/lamb/), a section with no "type" (no optimizer), and
the guard ZeRO puts on optimizers it has not tested. Also the two things DeepSpeed refuses that
minitron once took: ``sparse_gradients`` at any value and WarmupLR's ``warmup_num_steps: 0``.

FusedLamb is a CUDA kernel only in DeepSpeed, so no CPU run of DeepSpeed can be its yardstick:
it is held here against the kernel's arithmetic as csrc/lamb/fused_lamb_cuda_kernel.cu states
it, written out again in float64 (``lamb_reference``). SGD is held against DeepSpeed's own
engine in test_ds_optimizers_peer.py.
"""

import math

import pytest
import torch

from distributed import run_ranks
from minitron.ops.lamb import FusedLamb
from minitron.runtime.config import DeepSpeedConfig
from minitron.runtime.config_values import DeepSpeedConfigError
from minitron.runtime.lr_schedules import WarmupDecayLR, WarmupLR
from test_ds_checkpoint import TiedNet, batch, train

LAMB = {"lr": 0.02, "weight_decay": 0.01, "max_coeff": 0.5, "min_coeff": 0.05}


def config(kind: str, stage: int = 0, **more) -> dict:
    params = LAMB if kind == "Lamb" else {"lr": 0.05, "momentum": 0.9}
    return {"train_batch_size": 4, "gradient_clipping": 0.0, "zero_optimization": {"stage": stage},
            "optimizer": {"type": kind, "params": params}, **more}


@pytest.mark.parametrize("section, resolved", [
    ({"type": "LAMB"}, "Lamb"), ({"type": "lamb"}, "Lamb"), ({"type": "SGD"}, "SGD"),
    ({"params": {"lr": 5.0}}, None), ({}, None)])
def test_optimizer_names_resolve_as_deepspeeds(section, resolved):
    cfg = DeepSpeedConfig({"train_batch_size": 2, "optimizer": section}, world_size=1)
    assert cfg.optimizer_name == resolved
    assert (cfg.optimizer_params is None) == (resolved is None)   # a type-less section's params are not read


def test_defaults_are_fusedlambs_and_torch_sgds():
    lamb = DeepSpeedConfig(config("Lamb") | {"optimizer": {"type": "Lamb"}}, world_size=2).optimizer_params
    assert lamb == {"lr": 1e-3, "eps": 1e-8, "weight_decay": 0.0, "betas": [0.9, 0.999], "bias_correction": True,
                    "eps_inside_sqrt": False, "max_coeff": 10.0, "min_coeff": 0.01}
    sgd = DeepSpeedConfig(config("SGD") | {"optimizer": {"type": "SGD"}}, world_size=2).optimizer_params
    assert sgd == {"lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False,
                   "maximize": False}


@pytest.mark.parametrize("cfg, words", [
    ({"optimizer": {"type": "sgd"}}, "write 'SGD'"),
    (config("Lamb", stage=1), '"zero_allow_untested_optimizer": true'),
    (config("SGD", stage=3), "untested with ZeRO (stage 3)"),
    ({"optimizer": {"type": "Lamb", "params": {"max_grad_norm": 1.0}}}, '"gradient_clipping"'),
    ({"optimizer": {"type": "SGD", "params": {"nesterov": True}}}, "momentum > 0"),
    ({"optimizer": {"type": "Lamb", "params": {"adam_w_mode": True}}}, "unknown key 'adam_w_mode'"),
    ({"sparse_gradients": False}, "refuses the key whatever its value"),
    ({"sparse_gradients": True}, "refuses the key whatever its value"),
])
def test_refused_in_one_line(cfg, words):
    with pytest.raises(DeepSpeedConfigError, match=None) as refused:
        DeepSpeedConfig({"train_batch_size": 4, **cfg}, world_size=2)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_untested_optimizer_runs_under_zero_when_allowed():
    cfg = DeepSpeedConfig(config("Lamb", stage=2, zero_allow_untested_optimizer=True), world_size=2)
    assert cfg.zero_allow_untested_optimizer and cfg.optimizer_name == "Lamb"


@pytest.mark.parametrize("schedule", [WarmupLR, lambda opt, **kw: WarmupDecayLR(opt, 10, **kw)])
def test_warmup_of_zero_steps_is_refused_as_deepspeed_refuses_it(schedule):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="warmup_num_steps must be a positive integer, got 0"):
        schedule(opt, warmup_num_steps=0)


def lamb_reference(w, m, v, g, t, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, max_coeff=10.0,
                   min_coeff=0.01, bias_correction=True, eps_inside_sqrt=False):
    """One tensor's step, as the kernel's three parts compute it (float64 here)."""
    b1, b2 = betas
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    u = m / (torch.sqrt(v + eps) if eps_inside_sqrt else torch.sqrt(v) + eps) + weight_decay * w
    wn, un = math.sqrt(float((w * w).sum())), math.sqrt(float((u * u).sum()))
    coeff = 1.0
    if wn != 0 and un != 0:
        coeff = min(wn / un, max_coeff)
        coeff = max(coeff, min_coeff)
    step = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t) if bias_correction else lr
    return w - step * coeff * u, m, v, coeff


@pytest.mark.parametrize("options", [{}, LAMB, {"eps_inside_sqrt": True, "bias_correction": False, "eps": 1e-3},
                                     {"min_coeff": 3.0, "max_coeff": 2.0}])   # crossed: the floor wins
def test_lamb_is_the_kernels_arithmetic(options):
    torch.manual_seed(0)
    shapes = [(5, 3), (3,), (4,)]
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    params[2].data.zero_()                                   # a zero weight: ratio 1
    opt = FusedLamb(params, **options)
    ref = [(p.detach().double().clone(), torch.zeros(p.shape, dtype=torch.float64),
            torch.zeros(p.shape, dtype=torch.float64)) for p in params]
    for t in range(1, 4):
        grads = [torch.randn(s) * 10 ** k for k, s in enumerate(shapes)]   # far apart in size: ratios clip
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
        coeffs = []
        for k, g in enumerate(grads):
            w, m, v, c = lamb_reference(*ref[k], g.double(), t, **options)
            ref[k] = (w, m, v)
            coeffs.append(c)
        assert opt.get_lamb_coeffs() == pytest.approx(coeffs, rel=1e-5)
        for p, (w, m, v) in zip(params, ref):   # fp32 against fp64 arithmetic
            torch.testing.assert_close(p.detach().double(), w, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(opt.state[p]["exp_avg"].double(), m, rtol=1e-5, atol=1e-7)
    assert opt.state[params[0]]["step"] == 3
    if options:   # the gradients' sizes put a ratio at a bound
        assert {options.get("min_coeff"), options.get("max_coeff")} & set(coeffs) or "eps_inside_sqrt" in options


def _engine_runs(rank):
    """Lamb at stage 0 (a ratio per tensor, as DeepSpeed's stage 0), at stages 1 and 2 (one per
    rank's flat partition, as DeepSpeed's ZeRO hands it), and SGD at stage 0, against one
    process stepping the same optimizer over the whole batch."""
    from minitron.runtime import initialize
    out = {}
    for kind, stage in (("Lamb", 0), ("Lamb", 1), ("Lamb", 2), ("SGD", 0)):
        engine, *_ = initialize(model=TiedNet(), config=config(kind, stage, zero_allow_untested_optimizer=True))
        out[kind, stage] = {"losses": train(engine, rank, "fp32", range(3)),
                            "coeffs": engine.basic_optimizer.get_lamb_coeffs() if kind == "Lamb" else None,
                            "weights": [p.detach().clone() for p in engine.module.parameters()]}
    return out


def _serial(kind: str):
    model = TiedNet()
    opt = FusedLamb(model.parameters(), **LAMB) if kind == "Lamb" else torch.optim.SGD(
        model.parameters(), lr=0.05, momentum=0.9)
    for step in range(3):
        x, y = zip(*(batch(step, r, "fp32") for r in range(2)))
        # the ranks' two half-batch means, averaged: the mean over the whole batch
        torch.nn.functional.mse_loss(model(torch.cat(x)), torch.cat(y)).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


@pytest.fixture(scope="module")
def runs():
    return run_ranks(_engine_runs, world_size=2, tp=None)


@pytest.mark.parametrize("kind", ["Lamb", "SGD"])
def test_stage0_engine_steps_as_one_process_would(runs, kind):
    model, opt = _serial(kind)
    for rank in (0, 1):
        for mine, ref in zip(runs[rank][kind, 0]["weights"], model.parameters()):
            torch.testing.assert_close(mine, ref.detach(), rtol=1e-5, atol=1e-6)
    if kind == "Lamb":   # one ratio per tensor of the module, not one for the flat master
        assert runs[0][kind, 0]["coeffs"] == pytest.approx(opt.get_lamb_coeffs(), rel=1e-4)


def test_lamb_under_zero_takes_one_ratio_per_partition(runs):
    for rank in (0, 1):
        assert len(runs[rank]["Lamb", 1]["coeffs"]) == 1
        assert runs[rank]["Lamb", 1]["losses"] == pytest.approx(runs[rank]["Lamb", 2]["losses"], rel=1e-6)
    assert runs[0]["Lamb", 1]["coeffs"] != runs[1]["Lamb", 1]["coeffs"]   # each rank its own partition's
    assert runs[0]["Lamb", 1]["losses"][-1] != pytest.approx(runs[0]["Lamb", 0]["losses"][-1], rel=1e-6)
