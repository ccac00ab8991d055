"""The flags of Megatron's launch surface that issue #36 brought in: query-key layer scaling's
numbers, --logging-level, and the rules and header lines of the checkpoint-I/O, rerun-mode,
CUDA-graph and wandb flags."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from minitron.core.transformer.qk_layer_scaling import attention_scores
from minitron.training.argument_groups import ArgumentError
from minitron.training.argument_groups_ckpt import setup_logging
from minitron.training.arguments import GPT_ARGS_DEFAULTS, megatron_parser, validate_args
from minitron.training.arguments_policy import no_effect_lines

MODEL = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
         "--micro-batch-size", "1"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--disable-bias-linear"]


def validated(*extra, world=None):
    args = megatron_parser().parse_args([*MODEL, *extra])
    world = world or (2 if {"--num-distributed-optimizer-instances", "--expert-model-parallel-size"} & set(extra) else 1)
    args.rank, args.world_size, args.distributed_backend = 0, world, "gloo"
    return validate_args(args, dict(GPT_ARGS_DEFAULTS))


def test_layer_scaling_keeps_fp16_scores_in_range():
    """q.k / sqrt(d) = 80000 overflows fp16 (max 65504); through layer 4 it is stored as 20000."""
    q = torch.full((1, 1, 2, 4), 200.0, dtype=torch.float16)
    plain = attention_scores(q, q, 0.5, SimpleNamespace(apply_query_key_layer_scaling=False), 4)
    scaled = attention_scores(q, q, 0.5, SimpleNamespace(apply_query_key_layer_scaling=True), 4)
    assert torch.isinf(plain).all()
    assert scaled.dtype == torch.float32 and torch.equal(scaled, torch.full_like(scaled, 80000.0))


def test_layer_scaling_changes_only_the_rounding_in_fp32():
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(2))
    on, off = (attention_scores(q, k, 8 ** -0.5, SimpleNamespace(apply_query_key_layer_scaling=flag), 3)
               for flag in (True, False))
    assert torch.allclose(on, off, rtol=1e-6, atol=1e-6)


def test_layer_scaling_reaches_the_model_config_and_is_refused_with_context_parallelism():
    from minitron.training.arguments import core_transformer_config_from_args
    assert core_transformer_config_from_args(validated("--apply-query-key-layer-scaling")).apply_query_key_layer_scaling
    with pytest.raises(ArgumentError, match="context-parallel"):
        validated("--apply-query-key-layer-scaling", "--context-parallel-size", "2", world=2)


def test_logging_level_sets_the_root_logger(monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", root.level)   # restored afterwards
    monkeypatch.setenv("MEGATRON_LOGGING_LEVEL", "40")
    setup_logging(validated())
    assert root.level == 40                            # the environment, when the flag is absent
    setup_logging(validated("--logging-level", "10"))
    assert root.level == 10                            # the flag wins


@pytest.mark.parametrize("flags, said", [
    (["--ckpt-fully-parallel-load", "--no-ckpt-fully-parallel-save", "--ckpt-assume-constant-structure",
      "--auto-detect-ckpt-format"], ["--ckpt-fully-parallel-load", "--no-ckpt-fully-parallel-save",
                                     "--ckpt-assume-constant-structure", "--auto-detect-ckpt-format"]),
    (["--cuda-graph-impl", "local", "--wandb-entity", "team"], ["--cuda-graph-impl local", "--wandb-entity"]),
    (["--enable-cuda-graph"], ["--cuda-graph-impl local"]),
    (["--num-distributed-optimizer-instances", "2", "--use-distributed-optimizer", "--ddp-average-in-collective",
      "--overlap-p2p-communication-warmup-flush", "--defer-embedding-wgrad-compute", "--async-strategy", "nvrx",
      "--async-ckpt-use-cpu-shm"],
     ["--num-distributed-optimizer-instances", "--ddp-average-in-collective",
      "--overlap-p2p-communication-warmup-flush", "--defer-embedding-wgrad-compute", "--async-strategy",
      "--async-ckpt-use-cpu-shm"]),
    (["--overlap-moe-expert-parallel-comm", *MOE, "--bf16", "--expert-model-parallel-size", "2",
      "--moe-token-dispatcher-type", "alltoall"], ["--overlap-moe-expert-parallel-comm"]),
])
def test_accepted_flags_are_listed_once_in_the_header(flags, said):
    lines = no_effect_lines(validated(*flags))
    for flag in said:
        assert sum(f" {flag}:" in line for line in lines) == 1, lines


@pytest.mark.parametrize("flags, match", [
    (["--rerun-mode", "report_stats"], "report_stats"),
    (["--enable-cuda-graph", "--cuda-graph-impl", "local"], "--enable-cuda-graph"),
    (["--verify-integrity", "--ckpt-format", "torch"], "--verify-integrity"),
    (["--cuda-graph-modules", "attn", "conv"], "invalid choice: 'conv'"),
    (["--num-distributed-optimizer-instances", "3"], "does not divide data x context parallel size 2"),
    (["--ckpt-format", "fsdp_dtensor"], "Megatron-FSDP's checkpoint .* use torch_dist"),
    (["--tp-comm-overlap"], "add --sequence-parallel"),
    (["--overlap-param-gather-with-optimizer-step", "--use-distributed-optimizer", "--overlap-grad-reduce",
      "--overlap-param-gather"], "interleaved pipeline"),
    (["--overlap-moe-expert-parallel-comm", *MOE, "--bf16"], "--expert-model-parallel-size > 1"),
    (["--use-torch-fsdp2"], "--use-torch-fsdp2 needs --no-gradient-accumulation-fusion"),
])
def test_bad_combinations_are_one_line(flags, match):
    with pytest.raises(ArgumentError, match=match) as err:
        validated(*flags)
    assert "\n" not in str(err.value)


def test_defaults_are_megatrons():
    args = validated()
    assert (args.rerun_mode, args.cuda_graph_impl, args.ckpt_fully_parallel_save, args.ckpt_fully_parallel_load,
            args.finetune, args.logging_level) == ("validate_results", "none", True, False, False, None)
    assert not [line for line in no_effect_lines(args) if "ckpt" in line or "cuda-graph" in line]


def test_disable_bf16_reduced_precision_matmul_sets_torchs_switch_for_bf16():
    from minitron.training.argument_groups_launch import apply_bf16_matmul_precision
    matmul = torch.backends.cuda.matmul   # a property object: saved and restored by hand
    before = matmul.allow_bf16_reduced_precision_reduction
    try:
        matmul.allow_bf16_reduced_precision_reduction = True
        apply_bf16_matmul_precision(validated("--disable-bf16-reduced-precision-matmul"))   # not bf16: Megatron's rule
        assert matmul.allow_bf16_reduced_precision_reduction is True
        apply_bf16_matmul_precision(validated("--disable-bf16-reduced-precision-matmul", "--bf16"))
        assert matmul.allow_bf16_reduced_precision_reduction is False
    finally:
        matmul.allow_bf16_reduced_precision_reduction = before



def test_flex_dispatcher_runs_as_alltoall_under_megatrons_rules():
    args = validated(*MOE, "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "flex",
                     "--moe-flex-dispatcher-backend", "hybridep", world=2)
    assert args.moe_token_dispatcher_type == "alltoall"
    assert any("--moe-token-dispatcher-type flex (hybridep)" in line for line in no_effect_lines(args))
    with pytest.raises(ArgumentError, match="tensor x expert parallel size > 1"):
        validated(*MOE, "--moe-token-dispatcher-type", "flex")                  # deepep at tp x ep = 1
    with pytest.raises(ArgumentError, match="ncclep needs --moe-token-dispatcher-type flex"):
        validated(*MOE, "--moe-flex-dispatcher-backend", "ncclep")


def test_save_retain_interval_keeps_the_latest_and_every_nth(tmp_path):
    from minitron.training.checkpoint_files import iteration_dir, read_latest_iteration
    from minitron.training.checkpoint_retain import write_tracker
    kept = []
    for it in range(1, 7):   # a save every iteration, as the CI cases' --save-interval does
        iteration_dir(tmp_path, it).mkdir()
        write_tracker(tmp_path, it, 3)
        kept.append(sorted(int(p.name[5:]) for p in tmp_path.glob("iter_*")))
    assert kept[-1] == [3, 6] and kept[3] == [3, 4] and read_latest_iteration(tmp_path) == 6
    plain = tmp_path / "plain"
    for it in (1, 2):
        iteration_dir(plain, it).mkdir(parents=True)
        write_tracker(plain, it)
    assert sorted(p.name for p in plain.glob("iter_*")) == ["iter_0000001", "iter_0000002"]   # unset: all kept
