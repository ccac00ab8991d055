"""Context parallelism by all-to-all (--cp-comm-type a2a, and a2a+p2p) equals plain causal attention.

The kernels on 4 context-parallel ranks, values and gradients of q, k and v against the whole
sequence's attention (every permutation the two all-to-alls make must undo itself exactly).
A stress test: the default run holds the same through test_context_parallel.py's cp4-a2a-p2p
training layout, and a fork of four ranks costs about a second and a half.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distributed import run_ranks
from minitron.core import parallel_state as ps
from minitron.core.transformer.context_parallel import attn_forward_func_with_cp
from minitron.core.transformer.context_parallel_a2a import attn_forward_func_with_cp_a2a, attn_forward_func_with_cp_a2a_p2p
from minitron.training.utils import get_batch_on_this_cp_rank


def _causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _a2a_vs_serial(rank: int, hierarchical: bool = False) -> float:
    torch.set_num_threads(1)
    if hierarchical:   # a2a+p2p: all-to-all in pairs of cp ranks, a ring of two pairs
        ps.initialize_model_parallel(context_parallel_size=4, hierarchical_context_parallel_sizes=[2, 2])
    cp = ps.get_context_parallel_world_size()
    b, n, s, d = 2, 2 * cp, 4 * cp, 4
    g = torch.Generator().manual_seed(11)
    q, k, v, grad = (torch.randn(b, n, s, d, generator=g) for _ in range(4))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    out = _causal(*full)
    out.backward(grad)

    def mine(t):   # this rank's two chunks, as get_batch hands them out
        return get_batch_on_this_cp_rank({"x": t.transpose(1, 2)})["x"].transpose(1, 2)
    local = [mine(t).clone().requires_grad_() for t in (q, k, v)]
    if hierarchical:
        ours = attn_forward_func_with_cp_a2a_p2p(
            *local, lambda q, k, v, group: attn_forward_func_with_cp(q, k, v, d ** -0.5, cp_group=group))
    else:
        ours = attn_forward_func_with_cp_a2a(*local, _causal)
    ours.backward(mine(grad))
    errors = [(ours - mine(out)).abs().max()] + [(a.grad - mine(f.grad)).abs().max() for a, f in zip(local, full)]
    if hierarchical:
        ps.destroy_model_parallel()
    return max(e.item() for e in errors)


@pytest.mark.stress
def test_all_to_all_attention_equals_causal_attention():
    errors = run_ranks(_a2a_vs_serial, world_size=4, cp=4)
    assert max(errors) < 1e-5, errors


@pytest.mark.stress
def test_hierarchical_all_to_all_and_ring_equals_causal_attention():
    errors = run_ranks(lambda rank: _a2a_vs_serial(rank, hierarchical=True), world_size=4, tp=None)
    assert max(errors) < 1e-5, errors
