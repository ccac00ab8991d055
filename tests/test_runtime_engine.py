"""The engine (minitron/runtime/engine.py, zero/): initialize() on forked gloo ranks equals a serial
run at ZeRO 0-3 with gradient accumulation; each stage holds 1/dp of what it partitions;
checkpoints resume exactly; fp16 overflow skips steps with DeepSpeed's hysteresis."""

import math
import random

import pytest
import torch

from distributed import run_ranks
from toy_models import toy_mlp

from minitron.core.optimizer.grad_scaler import DynamicGradScaler
from minitron.runtime.loss_scaler import DynamicLossScaler
from minitron.runtime.lr_schedules import WarmupDecayLR, WarmupLR

IN, OUT, BATCH, STEPS = 6, 3, 8, 3
SCHED = {"warmup_min_lr": 0.004, "warmup_max_lr": 0.02, "warmup_num_steps": 4, "warmup_type": "linear"}
# Clipping at 0.05 binds on every step here; the test compares the norms it uses with serial's.
CONFIG = {"train_batch_size": BATCH, "gradient_accumulation_steps": 2, "gradient_clipping": 0.05,
          "optimizer": {"type": "Adam", "params": {"lr": 0.02, "weight_decay": 0.01}},
          "scheduler": {"type": "WarmupLR", "params": SCHED}}


def _data(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


def _groups(model) -> list:
    """Two param groups, as Megatron-DeepSpeed passes them: matrices decay, the rest does not.
    Each group gets its own flat buffer and partitions."""
    matrices = [p for p in model.parameters() if p.dim() == 2]
    return [{"params": matrices}, {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


def _serial_run(model, params, scheduled: bool) -> tuple[list, list]:
    """One process, the whole batch at once, torch's AdamW (DeepSpeed's "Adam" is AdamW):
    each step's loss and its gradient norm before clipping."""
    opt = torch.optim.AdamW(params, lr=0.02, weight_decay=0.01)
    sched = WarmupLR(opt, **SCHED) if scheduled else None
    losses, norms = [], []
    for step in range(STEPS):
        x, y = _data(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05).item())
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses, norms


def _serial_losses() -> tuple[list, list]:
    model = toy_mlp(0, IN, OUT)
    return _serial_run(model, _groups(model), scheduled=True)


def _train(engine, steps, first_step=0):
    """Each rank's share of every step's batch, micro-batch by micro-batch; returns the
    step losses averaged over the ranks, the gradient norms before clipping, and the bytes
    held after the first backward."""
    import torch.distributed as dist
    group = engine.data_parallel_group
    dp, rank = dist.get_world_size(group=group), dist.get_rank(group=group)
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    losses, norms, grad_bytes = [], [], None
    for step in range(first_step, first_step + steps):
        x, y = _data(step)
        total = 0.0
        for k in range(gas):
            rows = slice((k * dp + rank) * micro, (k * dp + rank + 1) * micro)
            loss = engine.backward(torch.nn.functional.mse_loss(engine(x[rows]), y[rows]))
            total += loss.item()
            if grad_bytes is None:   # between micro-batches: what accumulation keeps
                grad_bytes = engine.bytes_held()["grads"]
            engine.step()
        t = torch.tensor([total])
        dist.all_reduce(t, group=group)
        losses.append(t.item() / dp)
        norms.append(engine.optimizer._global_grad_norm)
    return losses, norms, grad_bytes


def _stages_body(world: int, ckpt_dir: str):
    def body(rank):
        from minitron.core import parallel_state
        from minitron.runtime import initialize
        out = {}
        for stage in (0, 1, 2, 3):
            # Replicas start different on purpose: initialize() must broadcast rank 0's weights.
            model = toy_mlp(rank, IN, OUT)
            engine, optimizer, loader, sched = initialize(
                model=model, model_parameters=_groups(model), mpu=parallel_state if stage == 2 else None,
                # Small buckets: stage 2 reduces several in backward, some parameters straddling
                # two ranks' partitions (the others ignore the size).
                config={**CONFIG, "zero_optimization": {"stage": stage, "reduce_bucket_size": 100}})
            assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0]
            assert loader is None and optimizer is engine.optimizer and sched is engine.lr_scheduler
            losses, norms, grad_bytes = _train(engine, STEPS)
            held = {**engine.bytes_held(), "grads": grad_bytes}
            out[stage] = {"losses": losses, "norms": norms, "bytes": held, "steps": engine.global_steps,
                          "micro": engine.micro_steps, "lr": engine.get_lr()[0]}
        if world == 2:
            out["resume"] = _resume(ckpt_dir)
            out["refused"] = _refuses_pipeline_parallel()
            out["fp16"] = _fp16_body(rank)
        else:   # the same ranks again as tensor parallel 2 x data parallel 2 (one launch for both)
            parallel_state.destroy_model_parallel()
            parallel_state.initialize_model_parallel(2)
            out["tp"] = _tp_body(rank)
        return out
    return body


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One launch per world size, each running every test's body that needs that many ranks."""
    return {world: run_ranks(_stages_body(world, str(tmp_path_factory.mktemp(f"engine{world}"))), world_size=world)
            for world in (2, 4)}


def _refuses_pipeline_parallel() -> str:
    """Pipelines need DeepSpeed's other engine (PipelineEngine), which is not built here."""
    from types import SimpleNamespace

    import torch.distributed as dist
    from minitron.runtime import initialize
    mpu = SimpleNamespace(get_tensor_model_parallel_world_size=lambda: 1,
                          get_pipeline_model_parallel_world_size=lambda: 2,
                          get_data_parallel_world_size=lambda: 1, get_data_parallel_group=lambda: dist.group.WORLD)
    try:
        initialize(model=toy_mlp(0, IN, OUT), config={**CONFIG, "train_batch_size": 4}, mpu=mpu)
    except ValueError as refusal:
        return str(refusal)
    return "accepted"


def _resume(ckpt_dir: str) -> dict:
    """Two steps, save, a third; a fresh engine loads and runs the third again."""
    from minitron.runtime import initialize
    found = {}
    for stage in (1, 3):
        config = {**CONFIG, "zero_optimization": {"stage": stage}}
        model = toy_mlp(0, IN, OUT)
        engine, *_ = initialize(model=model, model_parameters=_groups(model), config=config)
        _train(engine, 2)
        engine.save_checkpoint(ckpt_dir, tag=f"stage{stage}", client_state={"note": stage})
        third, _, _ = _train(engine, 1, first_step=2)
        model = toy_mlp(7, IN, OUT)
        fresh, *_ = initialize(model=model, model_parameters=_groups(model), config=config)
        path, client = fresh.load_checkpoint(ckpt_dir)   # 'latest' names the tag just saved
        again, _, _ = _train(fresh, 1, first_step=2)
        found[stage] = {"third": third, "again": again, "client": client, "steps": fresh.global_steps,
                        "path": path}
    return found


@pytest.mark.parametrize("world", [2, 4])
def test_zero_stages_equal_serial(world, launched):
    serial, serial_norms = _serial_losses()
    results = launched[world]
    replicated = results[0][0]["bytes"]
    for rank, out in enumerate(results):
        for stage in (0, 1, 2, 3):
            got = out[stage]
            assert got["losses"] == pytest.approx(serial, abs=1e-5), (world, stage, rank)
            # The norm clipping uses is the whole gradient's, not one partition's.
            assert got["norms"] == pytest.approx(serial_norms, rel=1e-5), (world, stage, rank)
            assert got["steps"] == STEPS and got["micro"] == 2 * STEPS
            # linear warmup: t = 2 after three applied steps
            assert got["lr"] == pytest.approx(0.004 + 0.016 * 2 / 4)
            held = got["bytes"]
            # Which of the three are cut: stage 1 the optimizer states, 2 also grads, 3 also params.
            for kind, from_stage in (("optimizer_states", 1), ("grads", 2), ("params", 3)):
                if stage >= from_stage:
                    # Up to padding: at most 2 x world fp32 elements per parameter tensor (8
                    # of them), for each of master, exp_avg, exp_avg_sq.
                    slack = 4 * 2 * world * 8 * 3
                    assert abs(held[kind] - replicated[kind] / world) <= slack, (stage, kind, held)
                else:
                    assert held[kind] == replicated[kind], (stage, kind, held)
    if world == 2:
        assert "pipeline-parallel size 2" in results[0]["refused"]
        for stage, found in results[0]["resume"].items():
            assert found["again"] == found["third"], stage   # exactly, not approximately
            assert found["client"] == {"note": stage} and found["steps"] == 3
            assert found["path"].endswith(f"stage{stage}")


HIDDEN_TP = 8


def _serial_tp_reference():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN_TP), torch.nn.Tanh(), torch.nn.Linear(HIDDEN_TP, OUT))


def _tp_body(rank):
    """Tensor parallel 2 x data parallel 2: Megatron's column- and row-parallel linears holding
    slices of the serial model's weights, parallel_state as the mpu."""
    from minitron.core import parallel_state as ps
    from minitron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from minitron.core.transformer import TransformerConfig
    from minitron.runtime import initialize

    tp, r = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    config = TransformerConfig(num_layers=1, hidden_size=HIDDEN_TP, num_attention_heads=tp,
                               tensor_model_parallel_size=tp)

    class TPMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            serial = _serial_tp_reference()
            self.fc1 = ColumnParallelLinear(IN, HIDDEN_TP, config=config, init_method=torch.nn.init.zeros_)
            self.fc2 = RowParallelLinear(HIDDEN_TP, OUT, config=config, init_method=torch.nn.init.zeros_,
                                         input_is_parallel=True)
            with torch.no_grad():
                self.fc1.weight.copy_(serial[0].weight.chunk(tp, 0)[r])
                self.fc1.bias.copy_(serial[0].bias.chunk(tp)[r])
                self.fc2.weight.copy_(serial[2].weight.chunk(tp, 1)[r])
                self.fc2.bias.copy_(serial[2].bias)   # replicated: counted once in the norm

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)[0]))[0]

    out = {}
    for stage in (0, 1, 2, 3):
        cfg = {k: v for k, v in CONFIG.items() if k != "scheduler"}
        engine, *_ = initialize(model=TPMLP(), mpu=ps, config={**cfg, "zero_optimization": {"stage": stage}})
        assert engine.dp_world_size == 2 and engine.train_micro_batch_size_per_gpu() == 2
        losses, norms, _ = _train(engine, STEPS)
        out[stage] = {"losses": losses, "norms": norms}
    return out


def test_zero_stages_with_tensor_parallelism_equal_serial(launched):
    model = _serial_tp_reference()
    serial, serial_norms = _serial_run(model, model.parameters(), scheduled=False)
    for rank, out in enumerate(ranks["tp"] for ranks in launched[4]):
        for stage, got in out.items():
            assert got["losses"] == pytest.approx(serial, abs=1e-5), (stage, rank)
            assert got["norms"] == pytest.approx(serial_norms, rel=1e-5), (stage, rank)


def _fp16_body(rank):
    from minitron.runtime import initialize
    config = {"train_batch_size": 4, "fp16": {"enabled": True, "initial_scale_power": 8, "hysteresis": 2},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zero_optimization": {"stage": 1}}
    engine, *_ = initialize(model=toy_mlp(0, IN, OUT), config=config)
    x, y = _data(0)
    rows = slice(2 * rank, 2 * rank + 2)
    seen = []
    for blow_up in (False, True, True, False):
        before = [p.detach().clone() for p in engine.module.parameters()]
        loss = torch.nn.functional.mse_loss(engine(x[rows].half()).float(), y[rows])
        if blow_up and rank == 1:
            loss = loss * float("inf")   # one rank's overflow must skip the step on every rank
        engine.backward(loss)
        engine.step()
        moved = any(not torch.equal(a, p) for a, p in zip(before, engine.module.parameters()))
        scaler = engine.optimizer.loss_scaler
        seen.append((moved, scaler.cur_scale, scaler.cur_hysteresis, engine.skipped_steps))
    return seen


def test_fp16_overflow_skips_with_hysteresis(launched):
    for seen in (ranks["fp16"] for ranks in launched[2]):
        # hysteresis 2: the first overflow only lowers the counter, the second halves 256.
        assert seen == [(True, 256.0, 2, 0), (False, 256.0, 1, 1), (False, 128.0, 1, 2), (True, 128.0, 1, 2)]


def test_dynamic_loss_scaler_hysteresis():
    s = DynamicLossScaler(init_scale=2.0 ** 10, scale_window=3, min_scale=1, delayed_shift=3)
    trace = []
    for overflow in (1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1):
        s.update_scale(bool(overflow))
        trace.append((s.cur_scale, s.cur_hysteresis))
    # 3 overflows (clean steps between do not refill) halve; then every overflow halves until
    # a growth refills the counter. The first growth after an overflow takes 3 + 1 clean steps,
    # the next one 3 (DeepSpeed's own update_scale, at 0.19.5, gives this same sequence).
    assert trace == [(1024, 2), (1024, 1), (1024, 1), (512, 1), (256, 1), (256, 1), (256, 1), (256, 1),
                     (512, 3), (512, 3), (512, 3), (1024, 3), (1024, 2)]
    c = DynamicLossScaler(init_scale=1024.0, scale_window=100, delayed_shift=2, consecutive_hysteresis=True)
    for overflow in (1, 0, 1, 0, 1, 1):
        c.update_scale(bool(overflow))
    assert c.cur_scale == 512   # only two overflows *in a row* halve
    floor = DynamicLossScaler(init_scale=2.0, min_scale=1.0)
    floor.update_scale(True)
    with pytest.raises(FloatingPointError):
        floor.update_scale(True)   # DeepSpeed stops at the floor rather than train there


def test_dynamic_loss_scaler_is_megatrons_with_growth_one_step_later():
    """Without DeepSpeed's extras, its scales are Megatron's whose growth count restarts at -1,
    not 0, after each overflow (and at the start): one clean step more before the first growth."""
    rng = random.Random(0)
    ds = DynamicLossScaler(init_scale=2.0 ** 20, scale_window=4, min_scale=1.0, delayed_shift=2,
                           raise_error_at_min_scale=False)
    mg = DynamicGradScaler(2.0 ** 20, 1.0, 2.0, 0.5, 4, 2)
    mg._growth_tracker = -1
    grew = 0
    for _ in range(300):
        overflow = rng.random() < 0.2
        before = ds.cur_scale
        ds.update_scale(overflow)
        mg.update(overflow)
        if overflow:
            mg._growth_tracker = -1
        grew += ds.cur_scale > before
        assert ds.cur_scale == mg.scale.item()
    assert grew > 5   # the growth rule was exercised, not only the halvings


def test_warmup_schedules():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    log = WarmupLR(opt, warmup_min_lr=0.0, warmup_max_lr=1.0, warmup_num_steps=10)
    assert opt.param_groups[0]["lr"] == 0.0   # set at construction, t = -1
    for _ in range(5):
        log.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(math.log(5) / math.log(10))   # t = 4
    decay = WarmupDecayLR(opt, total_num_steps=20, warmup_min_lr=0.1, warmup_max_lr=0.5, warmup_num_steps=4,
                          warmup_type="linear")
    lrs = []
    for _ in range(22):
        decay.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs[:5] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])                  # t = 0..4
    assert lrs[12] == pytest.approx(0.1 + 0.4 * (20 - 12) / 16)                  # decaying, t = 12
    assert lrs[20:] == pytest.approx([0.1, 0.1])                                 # at and past the end


def test_warmup_lr_defaults_to_each_groups_own_lr():
    """DeepSpeed 0.19.4+: without warmup_max_lr, WarmupLR warms every param group up to the lr
    it was given; WarmupDecayLR keeps its default of 0.001."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in (0.1, 0.2)]
    opt = torch.optim.SGD(groups)
    warm = WarmupLR(opt, warmup_num_steps=4, warmup_type="linear")
    assert [g["lr"] for g in opt.param_groups] == [0.0, 0.0]
    for _ in range(6):
        warm.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1, 0.2])
    decay = WarmupDecayLR(opt, total_num_steps=10, warmup_num_steps=4, warmup_type="linear")
    assert decay.max_lrs == [0.001, 0.001]


def test_runtime_package_imports_without_torch():
    """``minitron ds-config`` resolves a config before torch is loaded; initialize() imports
    the engine (and torch) only when called."""
    import subprocess
    import sys
    code = ("import sys, minitron.runtime as r; assert callable(r.initialize); "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
