"""fp8 recipes on one process: the casts against torch's own, the delayed scales against a
sequence worked by hand, the linear's three GEMMs against the same fp8 values multiplied out,
and the flags' refusals."""

from __future__ import annotations

import pytest
import torch

from minitron.core.fp8.linear import Fp8LinearWithAsyncCommunication, fp8_gemm
from minitron.core.fp8.recipes import (
    FORMATS, CurrentScaling, DelayedScaling, MXScaling, dequantize, formats_for, mx_quantize, quantize,
)
from minitron.core.fp8_utils import fp8_quantizers, get_fp8_context


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cast_is_torchs_cast_and_saturates(fmt):
    dtype, fp8_max = FORMATS[fmt]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g) * 3
    scale = torch.tensor(fp8_max / 12.0)
    q = quantize(x, scale, fmt)
    inside = (x * scale).abs() <= fp8_max
    ref = (x * scale).to(dtype)   # torch's own cast, where it needs no saturation
    assert q.dtype == dtype and inside.sum() > 3000 and (~inside).sum() > 0
    assert torch.equal(q[inside].view(torch.uint8), ref[inside].view(torch.uint8))
    # beyond the range: the format's largest finite value, with the sign (never inf or NaN)
    assert torch.equal(q[~inside].float(), torch.sign(x[~inside]) * fp8_max)
    assert torch.equal(dequantize(q, scale.reciprocal()), q.float() * scale.reciprocal())


def _scales_used(slot, amaxes):
    """Cast one tensor per step whose amax is given; the scale each cast used (1 / its 1/scale)."""
    used = []
    for a in amaxes:
        scale = float(slot.scale)   # what the next cast will use
        _, inv = slot.quantize(torch.tensor([a, -a / 3, 0.0]))
        assert float(inv) == float(torch.tensor(scale).reciprocal())
        used.append(scale)
    return used


# amaxes 2, 8, 1, 4, 0, 16: scale_t = 448 / amax / 2^margin from the steps before t, 1 at first
@pytest.mark.parametrize("history, algo, margin, expected", [
    (1, "most_recent", 0, [1, 224, 56, 448, 112, 112]),     # zero amax: the scale is kept
    (2, "max", 1, [1, 112, 28, 28, 56, 56]),                 # windows {2}, {8,2}, {1,8}, {4,1}, {0,4}
    (3, "max", 0, [1, 224, 56, 56, 56, 112]),                # {2}, {8,2}, {1,8,2}, {4,1,8}, {0,4,1}
    (3, "most_recent", 2, [1, 56, 14, 112, 28, 28]),
])
def test_delayed_scale_sequence_by_hand(history, algo, margin, expected):
    slot = DelayedScaling("e4m3", history, algo, margin)
    assert _scales_used(slot, [2, 8, 1, 4, 0, 16]) == expected


def test_current_scaling_and_formats():
    slot = CurrentScaling("e5m2")
    _, inv = slot.quantize(torch.tensor([0.5, -4.0]))
    assert float(slot.scale) == 57344 / 4 and torch.equal(inv, torch.tensor(4 / 57344))
    slot.quantize(torch.zeros(3))
    assert float(slot.scale) == 1.0                          # nothing to scale: 1, as TE
    assert formats_for("hybrid") == {"input": "e4m3", "weight": "e4m3", "grad_output": "e5m2"}
    assert set(formats_for("e4m3").values()) == {"e4m3"}


def test_mxfp8_blocks_share_a_power_of_two():
    """Each 32 elements along the dimension: exponent ceil(log2(amax / 448)) (exactly 448: 0,
    just above it: 1, zeros: -127), and the block is torch's own cast of x / 2^exponent."""
    import math
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 64, generator=g) * torch.logspace(-6, 3, 64).unsqueeze(1)   # blocks far apart
    x[0, :32], x[1, :32] = 0.0, torch.linspace(-448.0, 448.0, 32)
    x[2, :32] = x[2, :32] / x[2, :32].abs().max() * 449.0
    q, e = mx_quantize(x, "e4m3", dim=1)
    amax = x.view(64, 2, 32).abs().amax(-1)
    expected = torch.tensor([[math.ceil(math.log2(a / 448)) if a > 0 else -127 for a in row] for row in amax.tolist()])
    assert torch.equal(e.int() - 127, expected) and expected[1, 0] == 0 and expected[2, 0] == 1
    ref = (x.view(64, 2, 32) / torch.exp2(expected.float()).unsqueeze(-1)).to(torch.float8_e4m3fn).view(64, 64)
    assert torch.equal(q.view(torch.uint8), ref.view(torch.uint8))   # nothing needed clamping
    q0, e0 = MXScaling("e4m3").quantize(x.t(), dim=0)                # along the other dimension
    assert torch.equal(q0.t().view(torch.uint8), q.view(torch.uint8)) and torch.equal(e0.t(), e)
    torch.testing.assert_close(dequantize(q, e), x, rtol=2 ** -4, atol=0)


def test_linear_gemms_are_the_fp8_values_multiplied():
    """Forward, input and weight gradients, bias gradient: each from the fp8 tensors, as written
    out by hand; nothing else (the same float32 products)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 2, 16, generator=g, requires_grad=True)
    w = torch.randn(8, 16, generator=g, requires_grad=True)
    b = torch.randn(8, generator=g, requires_grad=True)
    dy = torch.randn(5, 2, 8, generator=g)
    fmts = formats_for("hybrid")
    slots = {role: CurrentScaling(fmt) for role, fmt in fmts.items()}
    y = Fp8LinearWithAsyncCommunication.apply(x, w, b, slots, False, False, None)
    y.backward(dy)

    def fp8(t, fmt):
        s = FORMATS[fmt][1] / t.detach().abs().max()
        return quantize(t.detach(), s, fmt).float() / s
    xq, wq, gq = fp8(x, "e4m3"), fp8(w, "e4m3"), fp8(dy, "e5m2")
    torch.testing.assert_close(y, xq @ wq.t() + b, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad, gq @ wq, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w.grad, gq.reshape(-1, 8).t() @ xq.reshape(-1, 16), rtol=1e-6, atol=1e-5)
    assert torch.equal(b.grad, dy.reshape(-1, 8).sum(0))      # from the unquantized gradient
    # the GEMM helper: a @ b^T of the dequantized operands, in the dtype asked for
    q, inv = slots["input"].quantize(x)
    assert fp8_gemm(q.reshape(-1, 16), inv, q.reshape(-1, 16), inv, torch.bfloat16).dtype == torch.bfloat16


def test_quantizers_only_inside_the_context():
    class Cfg:
        fp8, fp8_recipe, fp8_margin, fp8_amax_history_len, fp8_amax_compute_algo = "hybrid", "delayed", 0, 4, "max"
    layer = torch.nn.Linear(2, 2)
    assert fp8_quantizers(layer) is None
    with get_fp8_context(Cfg()):
        slots = fp8_quantizers(layer)
        assert fp8_quantizers(layer) is slots and slots["grad_output"].fmt == "e5m2"
        assert slots["weight"].history.shape == (4,)
    assert fp8_quantizers(layer) is None and "_fp8_quantizers" not in layer.state_dict()


@pytest.mark.parametrize("flags, words", [
    (["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"], "not so: tokens per micro-batch 16"),
    (["--fp8-format", "hybrid", "--fp8-recipe", "blockwise"], "128x128"),
    (["--fp8-param-gather"], "--fp8-param-gather needs --fp8-format"),
    (["--fp8-format", "hybrid", "--fp8-param-gather"], "needs --use-distributed-optimizer"),
    (["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8", "--fp8-param-gather", "--use-distributed-optimizer"],
     "--fp8-param-gather with --fp8-recipe mxfp8 is refused"),
    (["--fp8-format", "e4m3", "--recompute-granularity", "full", "--recompute-method", "uniform",
      "--recompute-num-layers", "1"], "fp8 recompute"),
    (["--fp8-format", "e4m3", "--fp8-amax-history-len", "0"], "at least 1"),
])
def test_refusals_are_one_line(capsys, flags, words):
    from minitron.cli.common import validate_pretrain
    argv = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
            "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--vocab-size", "1023"]
    with pytest.raises((Exception, SystemExit)) as refused:   # parse errors exit, validation raises
        validate_pretrain(argv + flags, 1)
    lines = (capsys.readouterr().err.strip() or str(refused.value)).splitlines()
    assert len(lines) <= 2 and words in lines[-1], lines   # argparse puts its usage line first


def test_scaled_mm_gets_the_layouts_it_takes(monkeypatch):
    """No fp8 GPU here: the three GEMMs' operands, as fp8_gemm hands them to torch._scaled_mm,
    go through its meta kernel, which checks what the CUDA one needs (row-major first operand,
    column-major second, sizes in 16s, 1-element fp32 scales)."""
    import minitron.core.fp8.linear as linear
    monkeypatch.setattr(linear, "_scaled_mm_takes", lambda a, b: True)
    m, k, n = 64, 32, 48
    x, w, g = (torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in
               (((m, k), torch.float8_e4m3fn), ((n, k), torch.float8_e4m3fn), ((m, n), torch.float8_e5m2)))
    s = torch.ones((), device="meta")
    assert fp8_gemm(x, s, w, s, torch.float32).shape == (m, n)          # Y = X W^T
    assert fp8_gemm(g, s, w.t(), s, torch.bfloat16).shape == (m, k)     # dX = dY W
    assert fp8_gemm(g.t(), s, x.t(), s, torch.float32).shape == (n, k)  # dW = dY^T X
