"""Megatron's fusions (minitron/core/fusions/), opt-in: the same numbers as the unfused path.

The math of each fused function is held against the plain formula the default path runs,
forward and backward, as written (``fn.__wrapped__``) and as torch.compile traces it with the
"eager" backend (dynamo's graph, no code generated: inductor's C++ build would cost seconds per
function here). One end-to-end run compiles for real: a small GPT trained on forked gloo ranks
with every fusion on, against the same run without.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from distributed import pretrain_records, run_ranks
from minitron.core.fusions import fused_cross_entropy
from minitron.core.fusions.fused_bias_dropout import bias_dropout_add, get_bias_dropout_add
from minitron.core.fusions.fused_bias_gelu import bias_gelu
from minitron.core.fusions.fused_bias_swiglu import bias_swiglu
from minitron.core.tensor_parallel import vocab_parallel_cross_entropy
from minitron.core.transformer import TransformerConfig
from minitron.core.transformer.mlp import mlp_activation

# fp32: the plain function, its trace and the hand-written formula run the same ops, but autograd's
# chain through F.gelu and a formula's derivative may round differently: a few ulps.
TOL = dict(rtol=1e-6, atol=1e-6)


def _forms(fused):
    """The plain function and its dynamo trace (backend "eager"): both must give the formula."""
    return [fused.__wrapped__, torch.compile(fused.__wrapped__, backend="eager", fullgraph=True)]


def _value_and_grads(fn, *inputs):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*inputs)
    grads = torch.autograd.grad(out, inputs, torch.linspace(-1, 1, out.numel()).view_as(out))
    return out.detach(), grads


@pytest.mark.parametrize("gated", [False, True], ids=["gelu", "swiglu"])
def test_bias_activation_matches_the_unfused_mlp(gated):
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, gated_linear_unit=gated,
                               activation_func=F.silu if gated else F.gelu)
    plain = mlp_activation(config)           # what MLP.forward runs after adding the bias
    g = torch.Generator().manual_seed(3)
    y, bias = torch.randn(5, 2, 12, generator=g) * 3, torch.randn(12, generator=g)
    want, want_grads = _value_and_grads(lambda y, b: plain(y + b), y, bias)
    for fn in _forms(bias_swiglu if gated else bias_gelu):
        args = (lambda y, b: fn(y, b)) if gated else (lambda y, b: fn(b, y))   # Megatron's orders
        got, grads = _value_and_grads(args, y, bias)
        torch.testing.assert_close(got, want, **TOL)
        for a, b in zip(grads, want_grads):
            torch.testing.assert_close(a, b, **TOL)
    # No bias (--disable-bias-linear): the activation alone.
    fused = bias_swiglu.__wrapped__(y, None) if gated else bias_gelu.__wrapped__(None, y)
    torch.testing.assert_close(fused, plain(y), **TOL)


def test_bias_dropout_add_fused_matches_the_formula():
    g = torch.Generator().manual_seed(5)
    x, residual = torch.randn(4, 2, 8, generator=g), torch.randn(4, 2, 8, generator=g)
    bias = torch.randn(8, generator=g)
    compiled = torch.compile(bias_dropout_add, backend="eager")
    for training in (True, False):
        want, want_grads = _value_and_grads(lambda x, b, r: r + x + b, x, bias, residual)   # p = 0: no mask
        got, grads = _value_and_grads(lambda x, b, r: compiled((x, b), r, 0.0, training), x, bias, residual)
        torch.testing.assert_close(got, want, **TOL)
        for a, b in zip(grads, want_grads):
            torch.testing.assert_close(a, b, **TOL)
    # With dropout, a compiled kernel draws its own mask; whatever it draws, each element is
    # either dropped (the residual alone) or kept and scaled by 1 / (1 - p), and some of each.
    p = 0.5
    out = compiled((x, bias), residual, p, True)
    kept = residual + (x + bias) / (1 - p)
    dropped = torch.isclose(out, residual)
    assert torch.where(dropped, residual, kept).allclose(out) and 0 < dropped.float().mean() < 1
    # Evaluation: no dropout, whatever p says.
    torch.testing.assert_close(compiled((x, bias), residual, p, False), residual + x + bias, **TOL)


def _compiled_dropout_masks(rank: int) -> dict:
    """The real compiled bias-dropout-add (inductor's own random numbers) on a TP rank: on the
    default stream and on the model-parallel one (TransformerBlock's choice with sequence parallelism)."""
    from minitron.core.fusions.fused_bias_dropout import bias_dropout_add_fused
    from minitron.core.tensor_parallel import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(3)
    g = torch.Generator().manual_seed(5)
    x, residual = torch.randn(64, 2, 8, generator=g), torch.randn(64, 2, 8, generator=g)
    bias = torch.randn(8, generator=g)
    default = bias_dropout_add_fused((x, bias), residual, 0.5, True)
    with get_cuda_rng_tracker().fork():
        tracked = bias_dropout_add_fused((x, bias), residual, 0.5, True)
    kept = residual + (x + bias) / 0.5
    return {name: (out, torch.where(torch.isclose(out, residual), residual, kept).allclose(out),
                   torch.isclose(out, residual).float().mean().item())
            for name, out in (("default", default), ("tracked", tracked))}


@pytest.mark.stress   # inductor compiles on each rank: ~10 s warm, ~30 s on a cold cache
def test_compiled_dropout_follows_the_tensor_parallel_streams():
    """Replicated activations stay replicated: on the default stream both TP ranks drop the same
    elements; on the model-parallel stream (sequence parallelism: each rank its own part) they differ."""
    ranks = run_ranks(_compiled_dropout_masks, world_size=2, tp=2)
    for rank in ranks:
        for out, is_dropout, dropped in rank.values():
            assert is_dropout and 0.3 < dropped < 0.7   # p = 0.5 over 1024 elements
    assert torch.equal(ranks[0]["default"][0], ranks[1]["default"][0])
    assert not torch.equal(ranks[0]["tracked"][0], ranks[1]["tracked"][0])


def test_get_bias_dropout_add_picks_the_path(monkeypatch):
    from minitron.core.fusions import fused_bias_dropout

    calls = []
    monkeypatch.setattr(fused_bias_dropout, "bias_dropout_add_fused", lambda *a: calls.append(a[2:]) or "fused")
    x, residual = torch.ones(2, 1, 4), torch.ones(2, 1, 4)
    assert get_bias_dropout_add(training=True, fused=True)((x, None), residual, 0.1) == "fused"
    assert calls == [(0.1, True)]
    plain = get_bias_dropout_add(training=False, fused=False)((x, None), residual, 0.9)
    assert torch.equal(plain, residual + x) and len(calls) == 1


def _cross_entropies(rank: int) -> dict:
    """The fused loss and gradient against vocab_parallel_cross_entropy's, bf16 and fp32 logits."""
    from minitron.core import parallel_state

    torch.set_num_threads(1)   # a lone forked rank: OpenMP's pool may deadlock after fork (test_gpt_model)
    tp, r = parallel_state.get_tensor_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_rank()
    for name in ("calculate_logits_max", "calculate_predicted_logits", "calculate_gradients"):
        fn = getattr(fused_cross_entropy, name)   # dynamo's trace of each piece, in this rank only
        setattr(fused_cross_entropy, name, torch.compile(fn.__wrapped__, backend="eager", fullgraph=True))
    g = torch.Generator().manual_seed(11)
    target = torch.randint(0, 16, (5, 3), generator=g)
    weights = torch.rand(5, 3, generator=g)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(5, 3, 16, generator=g) * 30).to(dtype).chunk(tp, dim=-1)[r]
        results = []
        for fn in (vocab_parallel_cross_entropy, fused_cross_entropy.fused_vocab_parallel_cross_entropy):
            mine = logits.clone().requires_grad_()
            loss = fn(mine, target)
            (loss * weights).sum().backward()
            results.append((loss.detach(), mine.grad))
        (loss, grad), (fused_loss, fused_grad) = results
        out[str(dtype)] = {"loss": (fused_loss - loss).abs().max().item(), "grad_dtype": fused_grad.dtype == dtype,
                           "grad": (fused_grad.float() - grad.float()).abs().max().item()}
    return out


@pytest.mark.parametrize("tp", [1, 2])
def test_fused_cross_entropy_matches_the_unfused(tp):
    for result in run_ranks(_cross_entropies, world_size=tp, tp=tp):
        fp32, bf16 = result["torch.float32"], result["torch.bfloat16"]
        assert fp32["loss"] < 1e-5 and fp32["grad"] < 1e-6, fp32
        # bf16 logits: the same fp32 arithmetic; the gradient rounded to bf16 (8 bits of mantissa).
        assert bf16["loss"] < 1e-5 and bf16["grad"] < 2 ** -8, bf16
        assert fp32["grad_dtype"] and bf16["grad_dtype"]


def _fused_calls(rank: int) -> list[str]:
    """Which fused functions a GPTModel with all three fields calls (plain stand-ins: no compile)."""
    from minitron.core.fusions import fused_bias_dropout
    from minitron.core.models.common.language_module import language_module
    from minitron.core.models.gpt import GPTModel
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.core.transformer import mlp

    torch.set_num_threads(1)   # a lone forked rank: OpenMP's pool may deadlock after fork (test_gpt_model)
    model_parallel_cuda_manual_seed(1)
    calls = []

    def record(name, fn):
        return lambda *args: calls.append(name) or fn(*args)
    mlp.bias_gelu_impl = record("bias_gelu", lambda y, b: bias_gelu.__wrapped__(b, y))
    fused_bias_dropout.bias_dropout_add_fused = record("bias_dropout_add", bias_dropout_add)
    language_module.fused_vocab_parallel_cross_entropy = record(
        "cross_entropy", fused_cross_entropy._VocabParallelCrossEntropy.apply)
    for name in ("calculate_logits_max", "calculate_predicted_logits", "calculate_gradients"):
        setattr(fused_cross_entropy, name, getattr(fused_cross_entropy, name).__wrapped__)
    config = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=4, bias_activation_fusion=True,
                               bias_dropout_fusion=True, cross_entropy_loss_fusion=True)
    ids = torch.arange(8).view(1, 8)
    GPTModel(config, 32, 8)(ids, ids, labels=ids).sum().backward()
    return calls


def test_the_layers_call_the_fused_functions_when_asked():
    calls = run_ranks(_fused_calls, world_size=1)[0]
    # two layers: one bias-GeLU each, two bias-dropout-adds each; one loss
    assert sorted(calls) == sorted(["bias_gelu"] * 2 + ["bias_dropout_add"] * 4 + ["cross_entropy"])


def test_flags_reach_the_config():
    from minitron.training.arguments import build_parser, core_transformer_config_from_args, validate_args

    def config(*flags):
        args = build_parser().parse_args(["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "4",
                                          "--ffn-hidden-size", "64", "--seq-length", "8", "--micro-batch-size", "1",
                                          "--vocab-size", "64", "--mock-data", *flags])
        args.rank, args.world_size = 0, 1
        validate_args(args, {"tokenizer_type": "NullTokenizer"})
        c = core_transformer_config_from_args(args)
        return c.bias_activation_fusion, c.bias_dropout_fusion, c.cross_entropy_loss_fusion

    assert config() == (False, False, False)
    assert config("--no-bias-gelu-fusion", "--no-bias-dropout-fusion") == (False, False, False)
    assert config("--bias-gelu-fusion", "--bias-dropout-fusion", "--cross-entropy-loss-fusion") == (True, True, True)
    # As Megatron maps them: the activation's fusion is --bias-swiglu-fusion's with --swiglu, else GeLU's.
    assert config("--swiglu", "--bias-gelu-fusion")[0] is False
    assert config("--swiglu", "--bias-swiglu-fusion")[0] is True
    with pytest.raises(ValueError, match="bias_activation_fusion fuses GeLU or SwiGLU"):
        TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, activation_func=F.relu,
                          bias_activation_fusion=True)


def test_the_benchmarks_fast_flags_are_these_fusions():
    """scripts/bench_gpu.py --fast adds flags that minitron implements, not ones it accepts idly."""
    import importlib.util

    from minitron.training.argument_groups import build_parser
    from minitron.training.arguments_policy import NO_EFFECT

    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_gpu.py"
    spec = importlib.util.spec_from_file_location("bench_gpu", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = build_parser().parse_args(bench.FAST_PATH_FLAGS)
    assert bench.FAST_PATH_FLAGS and not set(bench.FAST_PATH_FLAGS) & set(NO_EFFECT)
    assert args.bias_gelu_fusion and args.bias_swiglu_fusion and args.bias_dropout_fusion
    assert args.cross_entropy_loss_fusion and not args.no_effect


# --- end to end, compiled for real ---------------------------------------------------------------
FUSIONS = ["--bias-gelu-fusion", "--bias-dropout-fusion", "--cross-entropy-loss-fusion"]
MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "3", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "255", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo", "--tensor-model-parallel-size", "2"]


@pytest.mark.stress   # inductor compiles on each rank: ~12 s warm, ~30 s on a cold cache
def test_training_with_the_fusions_gives_the_unfused_losses(tmp_path):
    """tp 2 on two forked ranks (the fused cross entropy's all-reduce, the fusions on slices).
    Dropout off: a compiled dropout draws other random numbers than F.dropout."""
    plain = [r["lm_loss"] for r in pretrain_records(tmp_path / "plain", 2, MODEL)]
    fused = [r["lm_loss"] for r in pretrain_records(tmp_path / "fused", 2, [*MODEL, *FUSIONS])]
    # fp32 throughout; torch.compile keeps sums in registers and may reorder them, so the losses
    # agree to a few ulps of fp32 per step, not bit for bit: 1e-5 relative, as the layouts do.
    assert fused == pytest.approx(plain, rel=1e-5), (fused, plain)
    assert plain[-1] != plain[0]
