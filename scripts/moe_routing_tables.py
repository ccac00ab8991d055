"""Tables for chapter 16b's routing options, computed at build time by minitron's own router
functions on one set of logits (no ranks needed: routing is per token, or per rank's tokens).

    python scripts/moe_routing_tables.py groups    plain top-k beside group-limited top-k, per token
    python scripts/moe_routing_tables.py balance   tokens per expert: plain top-k, Sinkhorn, forced balance
"""

from __future__ import annotations

import sys

import torch

from minitron.core.tensor_parallel.random import get_cuda_rng_tracker, get_expert_parallel_rng_tracker_name
from minitron.core.transformer.moe.moe_utils import apply_random_logits, sinkhorn, topk_routing_with_score_function


def _experts(row: torch.Tensor) -> list[int]:
    return row.nonzero().flatten().tolist()


def groups() -> None:
    """8 experts on 4 expert-parallel ranks (2 each), top-4: without groups a token may need all 4
    ranks; with --moe-router-num-groups 4 --moe-router-group-topk 2 it needs 2."""
    logits = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    _, plain = topk_routing_with_score_function(logits, 4, score_function="sigmoid")
    _, limited = topk_routing_with_score_function(logits, 4, num_groups=4, group_topk=2, score_function="sigmoid")
    header = f"{'token':>5}  {'top-4 experts':<15}{'ranks':<14}{'group-limited':<15}{'ranks'}"
    print("Sigmoid scores, 8 experts, 2 per rank; group-limited: 4 groups (one per rank), 2 kept:\n")
    print(header + "\n" + "-" * len(header))
    for t in range(logits.shape[0]):
        a, b = _experts(plain[t]), _experts(limited[t])
        print(f"{t:>5}  {str(a):<15}{str(sorted({e // 2 for e in a})):<14}{str(b):<15}{sorted({e // 2 for e in b})}")


def balance() -> None:
    """A skewed router (experts 0 and 1 favoured by +1.5 on every token), 512 tokens, top-2."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(512, 8, generator=generator) + torch.tensor([1.5, 1.5, 0, 0, 0, 0, 0, 0])
    _, plain = topk_routing_with_score_function(logits, 2)
    chosen = torch.topk(sinkhorn(logits), k=2, dim=1).indices
    balanced = torch.zeros_like(plain).scatter(1, chosen, True)
    get_cuda_rng_tracker().add(get_expert_parallel_rng_tracker_name(), 1024)
    _, forced = topk_routing_with_score_function(apply_random_logits(logits), 2)
    header = f"{'routing':<28}{'tokens per expert (512 tokens x top-2 = 1024; even: 128)'}"
    print(header + "\n" + "-" * len(header))
    for name, routing_map in (("top-2 of the logits", plain), ("Sinkhorn (training)", balanced),
                              ("forced (random logits)", forced)):
        print(f"{name:<28}{routing_map.sum(dim=0).tolist()}")


if __name__ == "__main__":
    {"groups": groups, "balance": balance}[sys.argv[1]]()
