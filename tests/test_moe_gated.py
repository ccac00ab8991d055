"""Gated (SwiGLU) experts: --swiglu with --num-experts, as Mixtral and Qwen3-MoE train.

1. pretrain_gpt on forked gloo ranks, test_moe.py's 4-expert top-2 model with its routed experts
   and a shared expert all gated: per-iteration lm loss and load-balancing loss within 1e-5 of
   the serial run at tp 2 x ep 2 with the grouped GEMM (expert tp 2: each expert's fc1 cut into
   matching gate and up slices, stride 2, as the shared expert's is over tp); in the stress
   stage also at ep 2 and at tp 2 x ep 2 with SequentialMLP's loop.
2. The estimate's parameter count, closed form: an expert of 3 x h x ffn weights.
3. (stress) saved with --ckpt-format torch_dist at expert tp 2, with and without the grouped GEMM,
   resumed serially: the checkpoint's SwiGLU factory puts each slice's gate and up halves where
   the whole [gate | up] has them, and grouped experts are keyed as SequentialMLP's.
(Megatron-Core's own gated MoE layer, weight for weight: tests/test_mcore_moe.py; the estimate
against a gated run: tests/test_estimate_moe.py's ep2-tp2-sp-pad.)
"""

import pytest
from test_moe import EP, ITERS, run

# test_moe.py's model (run() puts its flags first), every MLP of it gated
GATED = ["--swiglu", "--ffn-hidden-size", "32", "--moe-shared-expert-intermediate-size", "16"]
TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]   # expert tp follows tp: 2
LAYOUTS = {   # name: (world, flags, in the default run)
    "ep2-etp2-grouped-gemm": (4, EP + TP2 + ["--moe-grouped-gemm"], True),   # all three at once, cheaply
    "ep2": (2, EP, False),
    "ep2-etp2": (4, EP + TP2, False),   # the loop over experts, each cut by expert tp
}


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return run(tmp_path_factory.mktemp("gated-serial"), "serial", 1, *GATED)


@pytest.mark.parametrize("name", [pytest.param(name, marks=() if default else pytest.mark.stress)
                                  for name, (_, _, default) in LAYOUTS.items()])
def test_gated_moe_layout_matches_serial(tmp_path, serial, name):
    world, flags, _ = LAYOUTS[name]
    losses, balance = run(tmp_path, name, world, *GATED, *flags)
    serial_losses, serial_balance = serial
    assert len(losses) == ITERS and losses[-1] != losses[0]   # trained, and the weights moved
    assert losses == pytest.approx(serial_losses, abs=1e-5), f"{name}: {losses} vs serial {serial_losses}"
    assert balance == pytest.approx(serial_balance, abs=1e-5), f"{name}: {balance} vs serial {serial_balance}"


def test_gated_expert_params_against_closed_form():
    """Gated, an expert holds fc1's [gate | up] (2 x ffn x h, 2 x ffn biases) and fc2 (h x ffn, h
    biases): a third more weights than a two-matrix expert; ep divides the experts."""
    from test_estimate import estimate_args

    from minitron.training import theoretical_memory_usage as tmu

    h, ffn, e, layers = 64, 256, 8, 4
    flags = ["--num-layers", str(layers), "--hidden-size", str(h), "--ffn-hidden-size", str(ffn),
             "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "1000", "--micro-batch-size", "1",
             "--num-experts", str(e)]
    plain = tmu.total_params(estimate_args(1, *flags))
    gated = tmu.total_params(estimate_args(1, "--swiglu", *flags))
    assert gated - plain == layers * e * (h * ffn + ffn)   # the up half of each expert's fc1
    expert = 3 * h * ffn + 2 * ffn + h
    serial = tmu.report_theoretical_memory(estimate_args(1, "--swiglu", *flags))[0].params
    per_rank = tmu.report_theoretical_memory(estimate_args(8, "--ep", "4", "--swiglu", *flags))[0].params
    assert serial - per_rank == layers * (e - e // 4) * expert   # 3/4 of the experts elsewhere


@pytest.mark.stress
@pytest.mark.parametrize("name", ["ep2-etp2", "ep2-etp2-grouped-gemm"])
def test_gated_experts_saved_at_etp2_resume_serially(tmp_path, serial, name):
    """torch_dist at tp 2 x ep 2: each rank writes its experts' [gate_r | up_r] as two pieces of
    the global [gate | up]; a serial run (SequentialMLP: the grouped GEMM's keys are its keys)
    reads whole experts back and repeats the serial run's third iteration."""
    ckpt = ["--ckpt-format", "torch_dist"]
    world, flags, _ = LAYOUTS[name]
    saved, _ = run(tmp_path, "saved", world, *GATED, *flags, *ckpt, "--exit-interval", "2",
                   "--save", str(tmp_path / "ck"))
    assert saved == pytest.approx(serial[0][:2], abs=1e-5)
    resumed, _ = run(tmp_path, "resumed", 1, *GATED, *ckpt, "--load", str(tmp_path / "ck"))
    assert resumed == pytest.approx(serial[0][2:], abs=1e-5)
