"""With --bf16, gradients are accumulated and reduced in fp32 unless --grad-reduce-in-bf16.

Megatron-Core 0.19.2's validate_args turns --accumulate-allreduce-grads-in-fp32 on by itself
for bf16 (its --main-grads-dtype defaults to fp32); fp16 and fp32 runs keep the weights' dtype
unless asked. minitron resolves the flag the same way, while validating, so the DDP buffers
(model_setup), the estimate's gradient bytes and its traffic all read one answer. The
end-to-end check (a bf16 run's buckets reduce in fp32) is in test_ddp_overlap.py; the
comparison with Megatron's own validate_args is marked mcore.
"""

from __future__ import annotations

import pytest

from minitron.cli.common import validate_pretrain
from minitron.training.theoretical_memory_usage import report_theoretical_memory
from minitron.training.tokenizer import build_tokenizer

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "1", "--mock-data", "--vocab-size", "64"]
CASES = {   # precision flags: is the gradient buffer fp32?
    "bf16": (["--bf16"], True),
    "bf16-grad-reduce-in-bf16": (["--bf16", "--grad-reduce-in-bf16"], False),
    "bf16-explicit-fp32": (["--bf16", "--accumulate-allreduce-grads-in-fp32"], True),
    "fp16": (["--fp16"], False),
    "fp16-fp32-grads": (["--fp16", "--accumulate-allreduce-grads-in-fp32"], True),
    "fp32": ([], False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_resolved_like_megatron(name):
    flags, fp32_grads = CASES[name]
    assert validate_pretrain([*MODEL, *flags], world=2).accumulate_allreduce_grads_in_fp32 is fp32_grads


def _grad_bytes(*flags) -> tuple[int, int]:
    args = validate_pretrain([*MODEL, *flags], world=2)
    build_tokenizer(args)   # the padded vocabulary, as `minitron estimate` sets it
    cost = report_theoretical_memory(args)[0]
    return cost.memory["grads"], cost.comm["dp-cp"]


def test_estimate_counts_fp32_gradients_for_bf16():
    fp32_bytes, fp32_sent = _grad_bytes("--bf16")
    bf16_bytes, bf16_sent = _grad_bytes("--bf16", "--grad-reduce-in-bf16")
    assert fp32_bytes == 2 * bf16_bytes   # the same elements, 4 bytes each instead of 2
    # The all-reduce sends the buffer, so it sends the extra bytes too (the loss's own small
    # fp32 all-reduce over the same group is the same in both).
    assert fp32_sent - bf16_sent == fp32_bytes - bf16_bytes


@pytest.mark.mcore
@pytest.mark.parametrize("name", list(CASES))
def test_megatron_resolves_the_same(name, monkeypatch):
    try:
        from megatron.training.arguments import parse_args, validate_args
    except ImportError as exc:
        pytest.skip(f"megatron.training does not import ({exc})")
    flags, fp32_grads = CASES[name]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr("sys.argv", ["pretrain_gpt.py", *MODEL, "--tokenizer-type", "NullTokenizer", *flags])
    args = validate_args(parse_args())
    assert args.accumulate_allreduce_grads_in_fp32 is fp32_grads
