"""The flags Megatron's CI configurations pass everywhere (issue #36): what minitron does with each.

Parsing and validation in this process (no rank); then three short runs in forked gloo ranks: the
params norm and the zero count of a tp=2 run against the serial run and a hand count, two
--deterministic-mode runs bit for bit (with --manual-gc's collections counted).
"""

from __future__ import annotations

import json

import pytest

from distributed import run_ranks
from minitron.training.argument_groups import ArgumentError, build_parser
from minitron.training.arguments import validate_args
from minitron.training.arguments_policy import NO_EFFECT, no_effect_lines

MODEL = "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1"
TRAIN = f"{MODEL} --train-iters 2 --lr 1e-3 --mock-data"


def _validate(flags: str, world: int = 1):
    args = build_parser().parse_args(f"{TRAIN} {flags}".split())
    args.rank, args.world_size = 0, world
    return validate_args(args, {"tokenizer_type": "NullTokenizer", "vocab_size": 1024})


@pytest.mark.parametrize("flag", ["--log-memory-to-tensorboard", "--log-validation-ppl-to-tensorboard",
                                  "--async-save", "--use-persistent-ckpt-worker", "--nvtx-ranges",
                                  "--disable-gloo-process-groups", "--enable-experimental",
                                  "--dist-ckpt-optim-fully-reshardable"])
def test_accepted_without_effect_and_listed(flag):
    args = _validate(flag)
    assert no_effect_lines(args) == [f"accepted, no effect here: {flag}: {NO_EFFECT[flag][1]}"]


@pytest.mark.parametrize("flag, good", [("--dist-ckpt-strictness", "log_all"), ("--cross-entropy-fusion-impl", "te")])
def test_valued_no_effect_flags_check_megatrons_choices(flag, good):
    assert _validate(f"{flag} {good}").no_effect == [flag]
    with pytest.raises(ArgumentError, match=f"argument {flag}: invalid choice: 'maybe'"):
        _validate(f"{flag} maybe")


def test_megatron_runs_without_validation_or_saving_when_told_so():
    # Megatron: --eval-iters 0 means no validation, --save-interval without --save saves nothing
    args = _validate("--eval-interval 1 --eval-iters 0 --save-interval 1")
    assert (args.eval_iters, args.save) == (0, None)


def test_recompute_modules_map_onto_selective_recomputation():
    args = _validate("--recompute-granularity selective")
    assert args.recompute_modules == ["core_attn"] and not no_effect_lines(args)
    args = _validate("--moe-layer-recompute")              # Megatron's rewrite: selective, core_attn + moe
    assert (args.recompute_granularity, args.recompute_modules) == ("selective", ["core_attn", "moe"])
    assert no_effect_lines(args) == ["accepted, no effect here: --recompute-modules moe: kept, not recomputed "
                                     "(minitron recomputes core_attn, mlp, shared_experts); memory only, the same "
                                     "gradients"]
    assert not no_effect_lines(_validate("--recompute-granularity selective --recompute-modules mlp"))
    for flags, words in [("--recompute-granularity selective --recompute-modules moe_act", "--moe-grouped-gemm"),
                         ("--recompute-granularity selective --recompute-modules mla_up_proj",
                          "only with --multi-latent-attention"),
                         ("--recompute-granularity selective --recompute-modules gdn_norm_out", "does not build"),
                         ("--moe-layer-recompute --recompute-granularity full --recompute-method uniform "
                          "--recompute-num-layers 1", "--moe-layer-recompute is selective"),
                         ("--recompute-modules attention", "invalid choice: 'attention'")]:
        with pytest.raises(ArgumentError, match=words):
            _validate(flags)


def test_nan_check_follows_megatron():
    assert _validate("").check_for_nan_in_loss_and_grad is True
    assert _validate("--no-check-for-nan-in-loss-and-grad").check_for_nan_in_loss_and_grad is False
    assert _validate("--fp16").check_for_nan_in_loss_and_grad is False      # the dynamic scaler wants Infs
    assert _validate("--fp16 --loss-scale 8").check_for_nan_in_loss_and_grad is True


@pytest.mark.parametrize("flags, words", [
    ("--padded-vocab-size 1000", "smaller than NullTokenizer's vocabulary"),
    ("--padded-vocab-size 2049 --tensor-model-parallel-size 2", "not divisible by --tensor-model-parallel-size 2"),
    ("--use-checkpoint-opt_param-scheduler --override-opt-param-scheduler", "exclude each other"),
    ("--deterministic-mode --cross-entropy-loss-fusion", "drop --cross-entropy-loss-fusion"),
    ("--log-params-norm --deepspeed --deepspeed-config x.json", "--log-params-norm reads Megatron's"),
])
def test_refusals_are_one_line(flags, words):
    with pytest.raises(ArgumentError, match=words) as err:
        _validate(flags, world=2 if "tensor-model" in flags else 1)
    assert "\n" not in str(err.value)


def test_deterministic_mode_refuses_a_nondeterministic_environment(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    with pytest.raises(ArgumentError, match="NCCL_ALGO='Tree' is not deterministic"):
        _validate("--deterministic-mode")
    monkeypatch.setenv("NCCL_ALGO", "Ring,CollnetDirect")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    with pytest.raises(ArgumentError, match="CUBLAS_WORKSPACE_CONFIG"):
        _validate("--deterministic-mode")


# --- runs ---------------------------------------------------------------------------------------
# Positions 16..31 of the learned position embedding are never used with --seq-length 16: their
# gradients are exactly zero, and nothing else is (no biases, whose key part has a gradient of zero
# in exact arithmetic and so sometimes in fp32) -- the hand count below. --padded-vocab-size gives
# tp=1 and tp=2 the same rows (each would pad 7 ids + eod to 128 x tp otherwise).
RUN = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
       "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
       "--train-iters", "2", "--lr", "1e-2", "--mock-data", "--vocab-size", "7", "--padded-vocab-size", "256",
       "--disable-bias-linear", "--attention-dropout", "0", "--hidden-dropout", "0",
       "--distributed-backend", "gloo", "--log-params-norm", "--log-num-zeros-in-grad",
       "--eval-interval", "2", "--eval-iters", "1", "--split", "90,10,0"]
TIMES = ("elapsed_ms", "tokens_per_s")   # the clock's, not the computation's


def _run(argv, world: int, tp: int = 1):
    def body(rank):
        import gc
        import os
        import tempfile

        import torch

        from minitron.pretrain_gpt import run_main
        from minitron.training.training import destroy_global_state

        full = []   # (phase, gc enabled) of each full collection: --manual-gc's, and only those
        gc.callbacks.append(lambda phase, info: info["generation"] == 2 and phase == "start"
                            and full.append(gc.isenabled()))
        path = os.path.join(tempfile.mkdtemp(), "it.jsonl")
        run_main([*argv, "--tensor-model-parallel-size", str(tp), "--log-jsonl", path])
        deterministic = torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        gc.callbacks.clear()
        destroy_global_state(world=False)
        records = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
        return records, deterministic, full
    return run_ranks(body, world, tp=None)


def test_params_norm_zeros_determinism_and_manual_gc():
    """Three runs: serial twice with --deterministic-mode and --manual-gc, and tp=2."""
    serial = RUN + ["--deterministic-mode", "--manual-gc", "--manual-gc-interval", "1"]
    (records, deterministic, full), = _run(serial, world=1)
    (again, _, _), = _run(serial, world=1)
    _, (tp2, _, _) = _run(RUN, world=2, tp=2)     # the last rank speaks
    assert deterministic == (True, ":4096:8")
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMES} for r in rs]   # noqa: E731
    assert strip(again) == strip(records)           # every number of every iteration, bit for bit
    for mine, theirs in zip(records, tp2, strict=True):
        assert mine["num_zeros"] == theirs["num_zeros"] == (32 - 16) * 16    # unused positions x hidden
        # The same weights in another layout: the sums' order differs, fp32 (relative 1e-6).
        assert mine["params_norm"] == pytest.approx(theirs["params_norm"], rel=1e-6)
    assert records[1]["params_norm"] != records[0]["params_norm"]   # each step's own weights
    # --manual-gc: the start, iteration 1, before and after the evaluation at 2, iteration 2;
    # and no automatic collection in between (the collector was off at each)
    assert full == [False] * 5


@pytest.mark.parametrize("flag, outcome", [("", "refused"), ("--use-checkpoint-opt_param-scheduler", "checkpoint"),
                                           ("--override-opt-param-scheduler", "flags")])
def test_a_resumed_schedule_follows_megatrons_two_flags(monkeypatch, flag, outcome):
    """The schedule saved at --lr 1e-3 meets a command line that says --lr 2e-3."""
    from minitron.training import model_setup

    class Optimizer:
        param_groups = [{"wd_mult": 1.0}]

    saved_args = _validate("")
    monkeypatch.setattr(model_setup, "get_args", lambda: saved_args)
    saved = model_setup.get_optimizer_param_scheduler(Optimizer()).state_dict()
    args = _validate(f"--lr 2e-3 {flag}")
    monkeypatch.setattr(model_setup, "get_args", lambda: args)
    scheduler = model_setup.get_optimizer_param_scheduler(Optimizer())
    if outcome == "refused":   # Megatron's default: a schedule that differs stops the resumed run
        with pytest.raises(ValueError, match="max_lr is 0.002 now but 0.001 in the checkpoint"):
            scheduler.load_state_dict(saved)
    else:
        scheduler.load_state_dict(saved)
        assert scheduler.max_lr == (1e-3 if outcome == "checkpoint" else 2e-3)
