"""Chapter 8's runs for the newer layer variants.

    python docs/examples/layer_variants_demo.py yarn    # gpt-oss's YaRN: which pairs keep, blend, slow
    python docs/examples/layer_variants_demo.py sinks   # how much attention a sink takes, row by row
    python docs/examples/layer_variants_demo.py glu     # gpt-oss's gated unit vs SwiGLU, on a few inputs
"""

from __future__ import annotations

import math
import sys


def yarn() -> None:
    """gpt-oss's head (64 channels, --rotary-base 150000) under its YaRN (a factor of 32 over
    4096 trained positions, no rounding): each pair's turns over the original context, and the
    ratio of its YaRN angle to plain rope's, read off YarnRotaryEmbedding's table."""
    from minitron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding

    emb = YarnRotaryEmbedding(64, rotary_base=150000, scaling_factor=32.0, original_max_position_embeddings=4096,
                              correction_range_round_to_int=False)
    plain, ratio = emb.inv_freq_extra, emb.yarn_inv_freq() / emb.inv_freq_extra
    kinds = ["kept" if math.isclose(r, 1, rel_tol=1e-6) else "slowed 32x" if math.isclose(r, 1 / 32, rel_tol=1e-6)
             else "blended" for r in ratio.tolist()]
    band = [i for i, kind in enumerate(kinds) if kind == "blended"]
    print("pair  turns in 4096 tokens  angle x")
    for i in (0, band[0] - 1, band[0], band[len(band) // 2], band[-1], band[-1] + 1, 31):
        turns = 4096 * plain[i].item() / (2 * math.pi)
        print(f"{i:>4}  {turns:>20,.2f}  {ratio[i].item():>7.3f}  {kinds[i]}")
    print("of 32 pairs: " + ", ".join(f"{kinds.count(k)} {k}" for k in ("kept", "blended", "slowed 32x")))
    _, mscale = emb(1)
    print(f"cos and sin times mscale = 0.1 ln 32 + 1 = {mscale:.4f}: scores x {mscale ** 2:.4f}")


def sinks() -> None:
    """One head's causal softmax over 6 keys, scores all 0, with a sink logit of -2, 0 (off-by-one)
    and 2: the share of each query's attention that the sink takes (and the keys do not get)."""
    import torch

    s = 6
    scores = torch.zeros(1, 1, s, s).masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -10000.0)
    print("query  keys seen  " + "  ".join(f"sink {v:+.0f}" for v in (-2.0, 0.0, 2.0)))
    shares = []
    for value in (-2.0, 0.0, 2.0):
        sink = torch.full((1, 1, s, 1), value)
        shares.append(torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[0, 0, :, -1])
    for q in range(s):
        print(f"{q:>5}  {q + 1:>9}  " + "  ".join(f"{share[q].item():>7.1%}" for share in shares))


def glu() -> None:
    """silu(g)·u (SwiGLU) against gpt-oss's quick_gelu(min(g, 7))·(clamp(u, -7, 7) + 1)."""
    import torch

    from minitron.core.activations import quick_gelu
    print("    gate      up    swiglu   gpt-oss")
    for g, u in ((-2.0, 0.0), (0.0, 3.0), (2.0, 0.0), (2.0, -1.0), (12.0, 12.0)):
        gate, up = torch.tensor(g), torch.tensor(u)
        oss = quick_gelu(gate.clamp(max=7.0)) * (up.clamp(-7.0, 7.0) + 1.0)
        swiglu = torch.nn.functional.silu(gate) * up
        print(f"{g:>8.1f}{u:>8.1f}{swiglu.item():>10.3f}{oss.item():>10.3f}")


if __name__ == "__main__":
    {"yarn": yarn, "sinks": sinks, "glu": glu}[sys.argv[1]]()
