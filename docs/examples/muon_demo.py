"""What Muon's Newton-Schulz iteration does to a matrix's singular values (chapter 14): a random
8 x 24 gradient's spread over an order of magnitude, the iteration's all near 1, in both of
DeepSpeed's forms and in the dtype each runs in on this machine."""
import torch

from minitron.runtime.zero.muon.original_muon import (ns_compute_dtype, zeropower_via_gram_newtonschulz,
                                                      zeropower_via_newtonschulz5)

torch.manual_seed(0)
G = torch.randn(8, 24) @ torch.diag(torch.logspace(0, -1, 24))   # columns scaled 1 .. 0.1
print(f"{'':<26}singular values (largest .. smallest)")
print(f"{'gradient G':<26}" + " ".join(f"{s:5.2f}" for s in torch.linalg.svdvals(G)))
for name, method, form in (("standard", zeropower_via_newtonschulz5, "standard"),
                           ("gram", zeropower_via_gram_newtonschulz, "gram")):
    dtype = str(ns_compute_dtype(form)).removeprefix("torch.")
    s = torch.linalg.svdvals(method(G).float())
    print(f"{f'NS(G), {name} {dtype}':<26}" + " ".join(f"{v:5.2f}" for v in s))
