"""jit_fuser: how Megatron-Core compiles its small fused functions (core/fusions/).

Megatron decorates each fused function with ``jit_fuser``, which is ``torch.compile`` on torch
2.2 and later (before that ``torch.jit.script``, whose nvFuser torch has dropped). The compiler
turns a chain of elementwise ops into one kernel: the tensor crosses memory once instead of once
per op. minitron does the same, with one difference: the compilation waits for the first call.

Why lazily: ``torch.compile`` imports torch._dynamo and inductor when it is *called*, even
before it compiles anything, 2 to 5 seconds on the CPUs here. As a decorator at import time,
every minitron command (``estimate``, ``--help``) would pay it, and so would the launcher's
parent before it forks its ranks. Deferred, only a rank whose model asked for a fusion pays,
once per function, at its first forward. Each forked rank compiles for itself (its own
process); inductor's on-disk cache lets the second rank and the next run reuse the first one's
kernels.
"""

from __future__ import annotations

import functools

import torch


def jit_fuser(fn):
    """``fn``, compiled by ``torch.compile`` at its first call; ``fn.__wrapped__`` is the plain one."""
    compiled = None

    @functools.wraps(fn)
    def run(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            compiled = torch.compile(fn)
        return compiled(*args, **kwargs)
    return run
