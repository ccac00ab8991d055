"""The plain PyTorch GPT the benchmarks hold minitron against: the same model as minitron's
default GPT (learned positions, pre-LayerNorm blocks with a fused QKV projection and torch's
scaled-dot-product attention, a GELU MLP of 4h, a final LayerNorm, the output layer tied to
the embedding), written the way a PyTorch user would write it in one file, with no parallelism.

scripts/bench_training.py (CPU, minitron's overhead) and scripts/bench_gpu.py (one GPU, speed
against eager and compiled) both train it, so the two compare with the same model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, h: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        self.qkv, self.proj = torch.nn.Linear(h, 3 * h), torch.nn.Linear(h, h)
        self.fc1, self.fc2 = torch.nn.Linear(h, 4 * h), torch.nn.Linear(4 * h, h)

    def forward(self, x):  # [b, s, h]
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # flash attention on a GPU
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class PlainGPT(torch.nn.Module):
    def __init__(self, vocab: int, h: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, h), torch.nn.Embedding(seq, h)
        self.blocks = torch.nn.ModuleList(Block(h, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(h)

    def forward(self, tokens, labels):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()   # the output layer is the embedding, tied
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))
