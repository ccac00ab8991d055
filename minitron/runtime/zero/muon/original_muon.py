"""``deepspeed/runtime/zero/muon/original_muon.py``: Muon's arithmetic (Keller Jordan 2024,
"Muon: MomentUm Orthogonalized by Newton-Schulz"), in plain torch.

Muon keeps an SGD momentum per weight matrix and, instead of stepping along it, steps along
the nearest semi-orthogonal matrix: for a momentum ``M = U S V^T`` (its SVD) the step is about
``U V^T``, every singular value pulled towards 1. An SVD per matrix per step is too slow, so a
quintic Newton-Schulz iteration approximates it with five rounds of matrix products:

    X <- a X + (b A + c A^2) X,   A = X X^T,   (a, b, c) = (3.4445, -4.7750, 2.0315)

after X is scaled to Frobenius norm 1 (so that its spectral norm is at most 1, inside the
iteration's basin). The coefficients trade exactness for speed: the singular values land in
roughly [0.7, 1.2], not on 1, which Muon's authors found costs nothing in training.

DeepSpeed 0.19.8 has two forms of the iteration, picked by the param group's ``ns_method``:

* "standard": the iteration above, on the wide orientation (rows <= cols), in bf16;
* "gram" (its default): the same polynomial carried on the small Gram matrix R = X X^T
  (rows x rows) and applied to X once at the end, with a restart after two rounds; in fp16,
  where the accelerator has it (an x86 CPU with AVX512-FP16/AMX, says mkldnn), else fp32.

Both give the same X up to rounding. The update is then scaled by sqrt(rows / cols) when a
matrix is taller than wide, so that a tall matrix's step has the RMS a wide one's has.
"""

from __future__ import annotations

import math

import torch


# The quintic's coefficients: the largest slope at zero that still keeps every singular value
# in a band around 1 after five rounds (Jordan's tuning).
A, B, C = 3.4445, -4.7750, 2.0315


def ns_compute_dtype(ns_method: str, device: torch.device | str = "cpu") -> torch.dtype:
    """The dtype DeepSpeed's iteration runs in on ``device``: gram's fp16 keeps more mantissa
    than bf16 at the same cost, and the Gram form needs it (its errors compound through R);
    the standard form is robust enough for bf16. DeepSpeed's CPU accelerator reports fp16 only
    where mkldnn has fp16 kernels, and bf16 always."""
    if ns_method != "gram":
        return torch.bfloat16
    if torch.device(device).type != "cpu":
        return torch.float16
    return torch.float16 if torch.ops.mkldnn._is_mkldnn_fp16_supported() else torch.float32


def _normalised(G: torch.Tensor) -> torch.Tensor:
    # Frobenius norm >= spectral norm, so dividing by it puts every singular value in [0, 1];
    # the 1e-7 keeps a zero gradient at zero instead of NaN.
    return G / (G.norm(dim=(-2, -1), keepdim=True) + 1e-7)


def zeropower_via_newtonschulz5(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The standard iteration: five rounds on X itself, in bf16."""
    tall = G.size(-2) > G.size(-1)
    X = G.to(ns_compute_dtype("standard", G.device))
    X = X.mT if tall else X   # iterate on the wide side: A = X X^T is then the smaller square
    X = _normalised(X)
    for _ in range(steps):
        Agram = X @ X.mT
        X = A * X + (B * Agram + C * Agram @ Agram) @ X
    return X.mT if tall else X


def zeropower_via_gram_newtonschulz(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The Gram iteration: X_k = Q_k X_0, with Q_k built from R = X X^T alone.

    Each round multiplies X on the left by P(R) = a + b R + c R^2; so instead of X the loop
    accumulates the product Q of those factors (rows x rows) and updates R to what X's Gram
    matrix would be (R <- P R P, P and R commuting). For a wide matrix (cols >> rows) this
    avoids every rows x cols product but the last. After two rounds X is rebuilt (X <- Q X)
    and R recomputed from it: in fp16 the Gram matrix drifts from X's true one, and one
    restart bounds that drift. A square or tall-turned-wide matrix with cols <= rows gains
    nothing and takes the standard rounds instead.
    """
    tall = G.size(-2) > G.size(-1)
    dtype = ns_compute_dtype("gram", G.device)
    # Normalise before casting to fp16: an fp32 gradient above 65504 would become inf first.
    X = G.to(torch.float32 if G.dtype == torch.float16 else G.dtype)
    X = X.mT if tall else X
    X = _normalised(X).to(dtype)
    rows, cols = X.size(-2), X.size(-1)
    if cols <= rows:   # square: the Gram form saves nothing
        for _ in range(steps):
            R = X @ X.mT
            X = A * X + (B * R + C * R @ R) @ X
        return X.mT if tall else X
    restart = 2
    R, Q = X @ X.mT, None
    for k in range(steps):
        if k == restart:   # fold the accumulated Q into X and start R afresh from it
            X = Q @ X
            R, Q = X @ X.mT, None
        Z = B * R + C * R @ R   # P(R) - a I
        if Q is None:
            Q = Z.clone()
            Q.diagonal(dim1=-2, dim2=-1).add_(A)   # Q = P(R) = a I + Z
        else:
            Q = A * Q + Z @ Q   # Q <- P(R) Q
        if k < steps - 1 and k + 1 != restart:   # the next round needs R <- P R P
            RZ = A * R + Z @ R
            R = A * RZ + Z @ RZ
    return X.mT @ Q.mT if tall else Q @ X


def aspect_ratio_scale(rows: int, cols: int) -> float:
    """sqrt(rows / cols) for a tall matrix, 1 otherwise: an orthogonalised tall matrix has
    smaller entries (its columns are unit vectors spread over more rows), and this restores
    the RMS per entry that a wide one has."""
    return math.sqrt(rows / cols) if rows > cols else 1.0


def muon_update(grad: torch.Tensor, momentum: torch.Tensor, beta: float = 0.95, ns_steps: int = 5,
                nesterov: bool = True, ns_method: str = "gram") -> torch.Tensor:
    """One matrix's Muon direction; ``momentum`` is updated in place, and so is ``grad``.

    A gradient with an Inf/NaN leaves the momentum untouched and comes back as it is: the
    loss scaler then sees the overflow and skips the step, and the momentum has not been
    poisoned for every later step (DeepSpeed's guard, for fp16 runs)."""
    dtype = grad.dtype
    finite = torch.isfinite(grad).all()
    momentum.copy_(torch.where(finite, momentum.lerp(grad, 1 - beta), momentum))
    # Nesterov: look ahead, g + beta (m - g), written into grad as DeepSpeed does
    update = grad.lerp_(momentum, beta) if nesterov else momentum
    if update.ndim == 4:   # a conv filter: out-channels x everything else
        update = update.view(len(update), -1)
    orthogonalise = zeropower_via_gram_newtonschulz if ns_method == "gram" else zeropower_via_newtonschulz5
    update = orthogonalise(update, steps=ns_steps) * aspect_ratio_scale(grad.size(-2), grad.size(-1))
    return torch.where(finite, update.to(dtype), grad.to(dtype))

