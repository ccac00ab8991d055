"""`estimate`'s compute: Megatron's num_floating_point_operations, held against a count of the
matmuls a real forward and backward performs (torch's FLOP counter), and the throughput and MFU
lines built on it."""

from __future__ import annotations

import json

import pytest
import torch

from cli_here import run_minitron
from distributed import run_ranks
from minitron.cli.command import expand_aliases
from minitron.cli.common import validate_pretrain
from minitron.training.theoretical_flops import FMA, FWD_BWD, num_floating_point_operations
from minitron.training.tokenizer import build_tokenizer

BASE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--micro-batch-size", "2", "--global-batch-size", "2", "--vocab-size", "200",
        # With attention dropout the core attention takes the explicit matmuls, which the FLOP
        # counter sees; torch's fused CPU kernel has no FLOP formula and would count as 0.
        "--attention-dropout", "0.1"]
MODELS = {
    "gpt": [],
    "llama": ["--swiglu", "--group-query-attention", "--num-query-groups", "2", "--normalization", "RMSNorm",
              "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights"],
    "moe": ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24"],
    "moe-gated": ["--swiglu", "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24"],
}


def _args(flags):
    args = validate_pretrain(expand_aliases(BASE + flags), 1)
    build_tokenizer(args)
    return args


def _counted(flags):
    """Every matmul of one forward and backward of the real model, counted by torch."""
    def body(rank):
        from torch.utils.flop_counter import FlopCounterMode
        from minitron.pretrain_gpt import ARGS_DEFAULTS, model_provider
        from minitron.training.global_vars import get_args
        from minitron.training.initialize import initialize_megatron

        torch.set_num_threads(1)
        initialize_megatron(args_defaults=ARGS_DEFAULTS, argv=expand_aliases(BASE + flags))
        args = get_args()
        model = model_provider()
        tokens = torch.randint(0, 200, (args.micro_batch_size, args.seq_length))
        positions = torch.arange(args.seq_length).expand_as(tokens)
        counter = FlopCounterMode(display=False)
        with counter:
            loss = model(tokens, positions, None, labels=tokens).float().mean()
            loss.backward()
        return counter.get_total_flops()
    return run_ranks(body, world_size=1)[0]


@pytest.mark.parametrize("name", MODELS)
def test_megatrons_count_is_the_matmuls_less_its_stated_omissions(name):
    args = _args(MODELS[name])
    formula = num_floating_point_operations(args, args.global_batch_size)
    b, s, L = args.global_batch_size, args.seq_length, args.num_layers
    query = args.kv_channels * args.num_attention_heads
    # The counter multiplies the whole s × s score matrix (QK^T and scores·V); Megatron counts
    # the causal half of it: the other half is what the counter finds in addition.
    causal_half = FWD_BWD * FMA * b * s * s * query * L
    # Megatron leaves the router's h × E GEMM out.
    router = FWD_BWD * FMA * b * s * args.hidden_size * args.num_experts * L if args.num_experts else 0
    assert _counted(MODELS[name]) == formula + causal_half + router


def test_each_term_scales_as_megatron_states():
    args = _args([])
    one = num_floating_point_operations(args, 1)
    assert num_floating_point_operations(args, 8) == 8 * one           # linear in the batch
    h, V, s, L = args.hidden_size, args.padded_vocab_size, args.seq_length, args.num_layers
    # Per token and layer 24h² forward (QKV 6h², output 2h², the 4h MLP 16h²), ×3 with the backward;
    # with the causal half of attention and the logits: 72·B·s·L·h²·(1 + s/(12h) + V/(12·L·h)).
    assert one == 72 * s * L * h * h * (1 + s / (12 * h) + V / (12 * L * h))


def test_estimate_prints_throughput_and_mfu(tmp_path):
    flags = [*BASE, "--global-batch-size", "4"]   # the later flag wins, as in argparse
    proc = run_minitron("estimate", "--world", "2", *flags, "--iteration-time", "2", "--peak-tflops", "h100",
                        "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    args = validate_pretrain(expand_aliases(flags), 2)
    build_tokenizer(args)
    flops = num_floating_point_operations(args, 4)
    assert out["flops_per_iteration"] == flops
    assert out["tokens_per_iteration"] == 4 * 16
    assert out["throughput_per_gpu_tflops"] == pytest.approx(flops / (2 * 1e12 * 2))  # 2 s, 2 GPUs
    assert out["mfu"] == pytest.approx(out["throughput_per_gpu_tflops"] / 989)
