"""Chapter 8's runs for the position and grouped-query options.

    python docs/examples/attention_demo.py rope   # Llama 3.1's rope scaling, channel pair by pair
    python docs/examples/attention_demo.py gqa    # fewer key/value groups than tp ranks, vs serial
    python docs/examples/attention_demo.py window # a sliding window's mask, and which layers use it
"""

from __future__ import annotations

import math
import sys


def rope() -> None:
    """Llama 3.1 8B's head (128 channels, --rotary-base 500000, --rope-scaling-factor 8): which
    channel pairs RotaryEmbedding._apply_scaling keeps, blends or slows, read off its table."""
    from minitron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    plain = RotaryEmbedding(128, rotary_base=500000).inv_freq
    scaled = RotaryEmbedding(128, rotary_base=500000, rope_scaling=True, rope_scaling_factor=8).inv_freq
    ratio = scaled / plain
    kinds = ["kept" if r == 1 else "slowed 8x" if math.isclose(r, 1 / 8, rel_tol=1e-6) else "blended" for r in ratio]
    print("pair  wavelength (tokens)  angle per token x")
    band = [i for i, kind in enumerate(kinds) if kind == "blended"]
    for i in (0, band[0] - 1, *band, band[-1] + 1, 63):      # the ends, and the band between
        print(f"{i:>4}  {2 * math.pi / plain[i].item():>19,.0f}  {ratio[i].item():>15.3f}  {kinds[i]}")
    print("of 64 pairs: " + ", ".join(f"{kinds.count(k)} {k}" for k in ("kept", "blended", "slowed 8x")))


# Dropout off, and 1023 tokens + end-of-document pad to the same 1024 rows for tp 1 and tp 4.
TRAIN = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo", "--group-query-attention", "--num-query-groups", "2",
         "--position-embedding-type", "rope"]


def gqa() -> None:
    """pretrain_gpt with 8 heads in 2 key/value groups, serially and on 4 tensor-parallel ranks
    (two ranks per group); each run's lm loss per iteration from its iterations.jsonl."""
    from cp_demo import losses_of   # the same runner as chapter 15's (this folder is on sys.path)

    losses = losses_of({"serial": (1, []), "tp 4": (4, ["--tensor-model-parallel-size", "4"])}, TRAIN)
    print(f"iteration  {'serial':>12}  {'tp 4':>12}  relative difference")
    for i, (a, b) in enumerate(zip(*losses.values()), start=1):
        print(f"{i:>9}  {a:>12.9f}  {b:>12.9f}  {abs(b - a) / abs(a):.1e}")


def window() -> None:
    """--window-size 3,0 over 8 tokens: the mask DotProductAttention adds (● seen, · hidden), and
    which of 6 layers use it with --window-attn-skip-freq 3 (the layers ask the same helper)."""
    from minitron.core.transformer.utils import get_sliding_window_causal_mask, is_layer_window_attention

    hidden = get_sliding_window_causal_mask(8, 8, (3, 0))
    print("query  keys 0..7")
    for i in range(8):
        print(f"{i:>5}  " + " ".join("·" if hidden[i, j] else "●" for j in range(8)))
    print("layers 1..6: " + " ".join("window" if is_layer_window_attention((3, 0), 3, n) else "full"
                                     for n in range(1, 7)))


if __name__ == "__main__":
    {"rope": rope, "gqa": gqa, "window": window}[sys.argv[1]]()
