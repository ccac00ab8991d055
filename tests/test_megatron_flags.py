"""Megatron's example launch scripts against minitron's parser: no flag is "unrecognized".

The flags are those of Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh,
examples/llama/train_llama3_8b_h100_fp8.sh and examples/mixtral/train_mixtral_8x7b_distributed.sh
(torchrun's own --nproc_per_node, --nnodes, ... left out). Each must be known (implemented),
accepted with no effect (and said so in the header), or refused by name with its reason
(arguments_policy.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli_here import run_minitron
from minitron.training.argument_groups import ArgumentError, build_parser
from minitron.training.arguments_policy import NO_EFFECT, REFUSED, _NoEffect, _Refused

GPT3_175B = """--num-layers --hidden-size --num-attention-heads --seq-length --max-position-embeddings
--attention-backend --micro-batch-size --global-batch-size --step-batch-size-schedule --train-iters
--weight-decay --adam-beta1 --adam-beta2 --init-method-std --clip-grad --fp16 --lr --lr-decay-style
--min-lr --lr-warmup-fraction --lr-decay-iters --tensor-model-parallel-size
--pipeline-model-parallel-size --data-path --vocab-file --merge-file --split --log-interval
--save-interval --eval-interval --save --load --eval-iters --tensorboard-dir"""
LLAMA3_8B_FP8 = """--adam-beta1 --adam-beta2 --apply-layernorm-1p --attention-backend --attention-dropout --bf16
--calculate-per-token-loss --ckpt-format --clip-grad --context-parallel-size --cross-entropy-loss-fusion
--data-cache-path --data-path --decoupled-lr --decoupled-min-lr --disable-bias-linear
--distributed-timeout-minutes --empty-unused-memory-level --eval-interval --eval-iters
--exit-duration-in-mins --ffn-hidden-size --fp8-amax-compute-algo --fp8-amax-history-len --fp8-format
--fp8-param-gather --global-batch-size --grad-reduce-in-bf16 --group-query-attention --hidden-dropout
--hidden-size --init-method-std --kv-channels --load --log-interval --log-throughput --lr
--lr-decay-samples --lr-decay-style --lr-warmup-samples --manual-gc --max-position-embeddings
--micro-batch-size --min-lr --mock-data --no-create-attention-mask-in-dataloader --no-mmap-bin-files
--normalization --num-attention-heads --num-layers --num-query-groups --num-workers
--overlap-grad-reduce --overlap-param-gather --pipeline-model-parallel-size --position-embedding-type
--profile --profile-step-end --profile-step-start --rotary-base --rotary-percent --save --save-interval
--seq-length --sequence-parallel --split --swiglu --tensor-model-parallel-size --tensorboard-dir
--tiktoken-pattern --tokenizer-model --tokenizer-type --train-samples
--untie-embeddings-and-output-weights --use-distributed-optimizer --use-mcore-models --vocab-size
--weight-decay"""
MIXTRAL_8X7B = """--attention-dropout --bf16 --clip-grad --data-path --disable-bias-linear --eval-interval
--eval-iters --expert-model-parallel-size --ffn-hidden-size --global-batch-size --group-query-attention
--hidden-dropout --hidden-size --init-method-std --load --log-interval --lr --lr-decay-iters
--lr-decay-style --lr-warmup-iters --max-position-embeddings --micro-batch-size --min-lr
--moe-aux-loss-coeff --moe-grouped-gemm --moe-router-load-balancing-type --moe-router-topk
--moe-token-dispatcher-type --no-load-optim --no-load-rng --no-masked-softmax-fusion
--no-position-embedding --normalization --num-attention-heads --num-experts --num-layers
--num-query-groups --overlap-grad-reduce --overlap-param-gather --pipeline-model-parallel-size
--position-embedding-type --rotary-base --save --save-interval --seq-length --sequence-parallel --split
--swiglu --tensor-model-parallel-size --tensorboard-dir --tokenizer-model --tokenizer-type --train-iters
--untie-embeddings-and-output-weights --use-distributed-optimizer --use-mcore-models --wandb-exp-name
--wandb-project --weight-decay"""
# The fusion, backend and logging flags the task named beside the scripts' own, and those of
# gpt-oss's and the RL configs' flags the policy answers (tests/example_scripts.py has them all).
NAMED = """--no-bias-gelu-fusion --no-bias-dropout-fusion --no-gradient-accumulation-fusion --no-rope-fusion
--transformer-impl --use-flash-attn --no-persist-layer-norm --log-timers-to-tensorboard
--tensorboard-log-interval --fp8-recipe
--export-force-local-attention --moe-permute-fusion --te-rng-tracker --moe-per-layer-logging
--attention-softmax-in-fp32 --quick-geglu --glu-linear-offset --activation-func-clamp-value --softmax-type
--enable-gpt-oss --add-qkv-bias --disable-bf16-reduced-precision-matmul"""
EXAMPLE_FLAGS = sorted({f for text in (GPT3_175B, LLAMA3_8B_FP8, MIXTRAL_8X7B, NAMED) for f in text.split()})


def _argv(action, flag):
    """The flag with a value if it takes one (the policy's flags take none or one)."""
    return [flag] + ["1"] * (action.nargs or 0)


def _kinds():
    parser = build_parser()
    kinds = {}
    for flag in EXAMPLE_FLAGS:
        action = parser._option_string_actions.get(flag)
        assert action is not None, f"{flag} (in Megatron's example scripts) would be unrecognized"
        kinds[flag] = ("refused" if isinstance(action, _Refused) else
                       "no effect" if isinstance(action, _NoEffect) else "known")
    return parser, kinds


def test_every_example_flag_is_known_accepted_or_refused():
    parser, kinds = _kinds()
    counts = {k: sum(1 for v in kinds.values() if v == k) for k in ("known", "no effect", "refused")}
    # Most of what the scripts say, minitron does; the rest is named here.
    assert counts["known"] > counts["no effect"] + counts["refused"], counts
    for flag, kind in kinds.items():
        if kind == "known":
            continue
        argv = _argv(parser._option_string_actions[flag], flag)
        if kind == "refused":
            with pytest.raises(ArgumentError, match=re.escape(f"{flag} is refused: {REFUSED[flag][1]}")):
                parser.parse_known_args(argv)
        elif kind == "no effect":
            args, _ = parser.parse_known_args(argv * 2)          # given twice: listed once
            assert args.no_effect == [flag]


def test_the_policy_lists_only_flags_minitron_does_not_implement():
    parser = build_parser()
    for flag in [*NO_EFFECT, *REFUSED]:
        actions = {id(a) for a in parser._actions if flag in a.option_strings}
        assert len(actions) == 1, f"{flag} is declared twice"
    assert not set(NO_EFFECT) & set(REFUSED)


# --- the header -------------------------------------------------------------------------------
MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1"]


def test_estimate_lists_each_no_effect_flag_once():
    flags = ["--use-mcore-models", "--attention-backend", "auto", "--use-mcore-models", "--log-timers-to-tensorboard"]
    done = run_minitron("estimate", "--world", "2", "--tp", "2", *MODEL, *flags, here=True)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("accepted, no effect here:")]
    assert lines == [f"accepted, no effect here: {f}: {NO_EFFECT[f][1]}"
                     for f in ("--use-mcore-models", "--attention-backend", "--log-timers-to-tensorboard")]
    done = run_minitron("estimate", "--world", "2", "--json", *MODEL, *flags, here=True)
    assert json.loads(done.stdout)["no_effect"] == ["--use-mcore-models", "--attention-backend", "--log-timers-to-tensorboard"]


@pytest.mark.parametrize("argv,words", [
    (["--fp8-format", "hybrid", "--fp8-recipe", "blockwise"], "--fp8-recipe blockwise is refused: Float8BlockScaling"),
    (["--fp8-format", "hybrid", "--fp8-param-gather"], "--fp8-param-gather needs --use-distributed-optimizer"),
    (["--enable-gpt-oss", "--yarn-beta-fast", "16"], "--yarn-beta-fast shapes --position-embedding-type yarn"),
    (["--moe-router-load-balancing-type", "quantile_balancing"], "invalid choice: 'quantile_balancing'"),
    (["--no-position-embedding"], "use --position-embedding-type none"),
    (["--position-embedding-type", "mrope"], "--position-embedding-type mrope: multimodal rope"),
    (["--bf16", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"], "exclude each other"),
    (["--world", "2", "--tp", "2", "--qk-layernorm", "--deepspeed", "--deepspeed-config",
      "docs/examples/ds_config_pretrain.json"], "per-head norms' gradients need a sum"),
])
def test_refusals_are_one_line(argv, words):
    world = [] if "--world" in argv else ["--world", "1"]
    done = run_minitron("estimate", *world, *MODEL, *argv, here=True, cwd=Path(__file__).parent.parent)
    assert done.returncode == 2, done.stdout + done.stderr
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
