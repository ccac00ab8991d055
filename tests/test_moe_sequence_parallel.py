"""MoE at tensor parallelism > 1 without --sequence-parallel: one rule for every command.

Megatron (core_r0.19.0) accepts such flags at setup (validate_args has no rule; its
ModelParallelConfig only warns, and only with expert parallelism too) and its MoELayer raises
at the first training forward. So minitron refuses a training step of them before any process
starts -- `pretrain`, `trace --steps N`, and `estimate`, which predicts one -- in the same one
line, and an initialization-only `trace` runs them, saying what Megatron warns and what a step
would meet. With --sequence-parallel all of them accept the same flags.
"""

from __future__ import annotations

import types

import pytest

from cli_here import run_minitron
from deadline import deadline

MODEL = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
         "--micro-batch-size", "1", "--num-experts", "2", "--disable-bias-linear",
         "--train-iters", "1", "--lr", "1e-3", "--mock-data"]
# world, the layout flags: tp 2 alone (Megatron gives no setup warning), and with ep 2 (it does)
LAYOUTS = {"tp2": ["--world", "2", "--tp", "2"], "tp2-ep2": ["--world", "4", "--tp", "2", "--ep", "2"]}
REFUSAL = ("MoE with --tensor-model-parallel-size 2 trains only with --sequence-parallel: Megatron's MoE layer "
           "raises at its first training forward")


def _refused_in_one_line(outcome) -> str:
    lines = outcome.stderr.strip().splitlines()
    assert outcome.returncode == 2 and len(lines) == 1, (outcome.returncode, outcome.stderr, outcome.stdout)
    assert "Traceback" not in outcome.stderr
    return lines[0]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_training_step_is_refused_by_every_command_in_the_same_line(layout, tmp_path):
    flags = LAYOUTS[layout] + MODEL
    estimate = run_minitron("estimate", *flags, here=True)
    pretrain = run_minitron("pretrain", *flags, "--log-dir", tmp_path / "logs", here=True)
    trace = run_minitron("trace", "--steps", "1", "--out", tmp_path / "trace", *flags, here=True)
    lines = {name: _refused_in_one_line(outcome) for name, outcome in
             (("estimate", estimate), ("pretrain", pretrain), ("trace", trace))}
    assert len(set(lines.values())) == 1, lines
    assert REFUSAL in lines["estimate"] and "add --sequence-parallel" in lines["estimate"]
    assert not (tmp_path / "logs").exists() and not (tmp_path / "trace").exists()  # nothing started


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_initialization_only_trace_runs_and_says_a_step_would_be_refused(layout, tmp_path):
    out = run_minitron("trace", "--backend", "fake", "--show", "checks", "--out", tmp_path / "t",
                       *LAYOUTS[layout], *MODEL, here=True)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stdout.splitlines() if line.startswith("warning: MoE")]
    assert len(warnings) == 1, out.stdout
    assert "a training step (--steps N) would be refused" in warnings[0]
    assert "add --sequence-parallel" in warnings[0]
    # Megatron's ModelParallelConfig warns only when expert parallelism joins tensor parallelism
    assert ("Megatron warns at setup" in warnings[0]) == (layout == "tp2-ep2")
    # the user's own experts: trace adds no --sequence-parallel to them
    assert "come with --sequence-parallel" not in out.stdout


def test_with_sequence_parallel_every_command_accepts_the_same_flags(tmp_path):
    flags = LAYOUTS["tp2"] + MODEL + ["--sequence-parallel"]
    estimate = run_minitron("estimate", *flags, here=True)
    assert estimate.returncode == 0 and "compute:" in estimate.stdout, estimate.stderr
    init = run_minitron("trace", "--backend", "fake", "--show", "checks", "--out", tmp_path / "init", *flags,
                        here=True)
    assert init.returncode == 0 and "warning: MoE" not in init.stdout, init.stderr
    # Real ranks (gloo) take the training step: each rank's MoE layer runs forward in training.
    # The commands run in this process, their ranks forked from it (torch is loaded already; a
    # fresh `minitron` would import it again): what a rank prints goes to its log, and each
    # command's exit code says whether every rank finished.
    with deadline(120):
        steps = run_minitron("trace", "--steps", "1", "--backend", "gloo", "--show", "checks",
                             "--out", tmp_path / "steps", *flags, here=True)
    assert steps.returncode == 0, steps.stdout[-2000:] + steps.stderr[-2000:]
    with deadline(120):
        pretrain = run_minitron("pretrain", "--backend", "gloo", "--log-dir", tmp_path / "logs", *flags, here=True)
    assert pretrain.returncode == 0, pretrain.stdout[-2000:] + pretrain.stderr[-2000:]


def test_trace_adds_sequence_parallel_only_to_its_own_default_experts():
    from minitron.cli.trace import default_experts

    assert default_experts(2, 2, []) == ["--num-experts", "2", "--sequence-parallel", "--disable-bias-linear"]
    assert default_experts(1, 2, []) == ["--num-experts", "2"]
    assert default_experts(2, 1, []) == []   # no expert parallelism: a dense default model
    for mine in (["--num-experts", "4"], ["--num-experts=4"]):   # the user's experts: left as given
        assert default_experts(2, 2, ["--lr", "1e-3", *mine]) == []


def test_trace_says_when_it_added_sequence_parallel(tmp_path):
    out = run_minitron("trace", "--backend", "fake", "--world", "4", "--tp", "2", "--ep", "2",
                       "--show", "checks", "--out", tmp_path / "t", here=True)
    assert out.returncode == 0, out.stderr
    assert "minitron's default experts (--num-experts 2) at tp 2 come with --sequence-parallel" in out.stdout
    assert "warning: MoE" not in out.stdout


def test_the_moe_layer_raises_in_training_as_megatrons_does():
    """A run started without minitron's commands (torchrun, `minitron launch`) meets Megatron's
    own check at the first training forward; evaluation (not training) is let through."""
    from minitron.core.transformer.moe.moe_layer import MoELayer

    class Reached(Exception):
        pass

    def router(hidden_states):
        raise Reached

    config = types.SimpleNamespace(tensor_model_parallel_size=2, sequence_parallel=False)
    layer = types.SimpleNamespace(training=True, config=config, layer_number=1, local_expert_indices=[0],
                                  shared_experts=None, router=router)
    with pytest.raises(ValueError, match="only with sequence_parallel"):
        MoELayer.forward(layer, None)
    for training, sp in ((False, False), (True, True)):
        layer.training, config.sequence_parallel = training, sp
        with pytest.raises(Reached):
            MoELayer.forward(layer, None)
