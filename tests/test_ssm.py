"""The SSD scan (core/ssm/ssd.py): the chunked form computes the step-by-step recurrence.

Random inputs with several heads per group and several groups, lengths that are and are not a
multiple of the chunk, chunk sizes from 1 (every step its own chunk: only the inter-chunk
recurrence works) to longer than the sequence (one chunk: only the masked matmul works), and
a starting state. fp64 agrees to 1e-12, fp32 to 1e-4 (relative to the output's size): the
chunked form sums in another order, and its exp(segsum) decays reach 1e-10 over long chunks.
Gradients agree too, since training backpropagates through the chunked form.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minitron.core.ssm.ssd import segsum, ssd_chunked, ssd_recurrence


def _inputs(dtype, batch=2, length=23, nheads=6, headdim=3, ngroups=2, dstate=5, seed=0):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)
    return dict(x=randn(batch, length, nheads, headdim), dt=F.softplus(randn(batch, length, nheads)),
                A=-torch.rand(nheads, generator=g, dtype=dtype) * 4, B=randn(batch, length, ngroups, dstate),
                C=randn(batch, length, ngroups, dstate), D=randn(nheads),
                initial_state=randn(batch, nheads, headdim, dstate))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-4)])
@pytest.mark.parametrize("chunk", [1, 4, 8, 23, 64])
def test_chunked_scan_equals_recurrence(dtype, tol, chunk):
    args = _inputs(dtype)
    y_ref, state_ref = ssd_recurrence(**args, return_final_state=True)
    y, state = ssd_chunked(**args, chunk_size=chunk, return_final_state=True)
    scale = y_ref.abs().max().item()
    assert (y - y_ref).abs().max().item() <= tol * scale, f"chunk {chunk}: outputs differ"
    assert (state - state_ref).abs().max().item() <= tol * state_ref.abs().max().item()


def test_chunked_scan_gradients_equal_recurrences():
    args = {k: v.requires_grad_() for k, v in _inputs(torch.float64, length=10).items()}
    leaves = list(args.values())
    grads_ref = torch.autograd.grad(ssd_recurrence(**args).square().sum(), leaves)
    grads = torch.autograd.grad(ssd_chunked(**args, chunk_size=4).square().sum(), leaves)
    for name, a, b in zip(args, grads, grads_ref):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10), f"d/d{name} differs"


def test_one_head_by_hand():
    """The recurrence itself, against the formula worked by hand for one head, one channel,
    one state entry: S_t = exp(dt A) S_{t-1} + dt x B, y = S C + D x."""
    x, dt, B, C = [1.0, 2.0, -1.0], [0.5, 1.0, 0.25], [1.0, -2.0, 3.0], [2.0, 1.0, -1.0]
    A, D = -0.8, 0.3
    state, expected = 0.0, []
    for t in range(3):
        state = torch.exp(torch.tensor(dt[t] * A)).item() * state + dt[t] * x[t] * B[t]
        expected.append(state * C[t] + D * x[t])
    y = ssd_recurrence(torch.tensor(x).view(1, 3, 1, 1), torch.tensor(dt).view(1, 3, 1), torch.tensor([A]),
                       torch.tensor(B).view(1, 3, 1, 1), torch.tensor(C).view(1, 3, 1, 1), torch.tensor([D]))
    assert torch.allclose(y.view(3), torch.tensor(expected), atol=1e-6)


def test_segsum_is_the_causal_decay_mask():
    a = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    s = segsum(a)
    assert s[3, 1].item() == pytest.approx(0.3 + 0.4) and s[2, 2].item() == 0.0
    assert torch.isinf(s[1, 2]) and s[1, 2] < 0
