"""Each mapping's forward and backward, on its own, on 4 ranks in two TP groups of 2.

Values depend on the *global* rank, so a mapping that talked to the whole world instead of its
tensor-parallel group ([0, 1] or [2, 3]) would get the wrong sums.
"""

from __future__ import annotations

import torch

from distributed import run_ranks
from minitron.core import parallel_state as ps
from minitron.core.tensor_parallel import mappings as m
from minitron.core.tensor_parallel import scatter_to_sequence_parallel_region


def _check_all_mappings(rank: int) -> bool:
    r = ps.get_tensor_model_parallel_rank()            # 0 or 1 inside the group
    members = ps.get_global_ranks("tp")                # [0, 1] or [2, 3]
    base = torch.arange(24, dtype=torch.float32).view(4, 2, 3)   # [s=4, b=2, h=3]
    wide = torch.arange(32, dtype=torch.float32).view(4, 2, 4)   # last dim splits in 2
    scale = lambda g: float(g + 1)                     # a different number on every global rank
    close = lambda a, b: torch.allclose(a, b)

    def run(fn, x, grad):
        x = x.clone().requires_grad_()
        y = fn(x)
        y.backward(grad)
        return y.detach(), x.grad

    # f: identity forward; backward sums the group's gradients.
    y, gx = run(m.copy_to_tensor_model_parallel_region, base, base * scale(rank))
    assert torch.equal(y, base)
    assert close(gx, base * sum(scale(g) for g in members))

    # g: forward sums the group's tensors; backward passes the gradient through.
    y, gx = run(m.reduce_from_tensor_model_parallel_region, base * scale(rank), base)
    assert close(y, base * sum(scale(g) for g in members))
    assert torch.equal(gx, base)

    # Scatter along the last dim: keep my half; backward gathers the halves of the gradient.
    grads = {g: wide[..., :2] * scale(g) for g in members}
    y, gx = run(m.scatter_to_tensor_model_parallel_region, wide, grads[rank])
    assert torch.equal(y, wide[..., 2 * r:2 * r + 2])
    assert close(gx, torch.cat([grads[g] for g in members], dim=-1))

    # Gather along the last dim: the halves become the whole; backward keeps my half.
    y, gx = run(m.gather_from_tensor_model_parallel_region, wide[..., 2 * r:2 * r + 2], wide * 10)
    assert torch.equal(y, wide)
    assert torch.equal(gx, (wide * 10)[..., 2 * r:2 * r + 2])

    # Sequence scatter: keep my half of the sequence; backward gathers the sequence's gradient.
    grads = {g: base[:2] * scale(g) for g in members}
    y, gx = run(m.scatter_to_sequence_parallel_region, base, grads[rank])
    assert torch.equal(y, base[2 * r:2 * r + 2])
    assert close(gx, torch.cat([grads[g] for g in members], dim=0))

    # Sequence gather before a TP layer: backward reduce-scatters the partial gradients.
    grads = {g: base * scale(g) for g in members}
    y, gx = run(m.gather_from_sequence_parallel_region, base[2 * r:2 * r + 2], grads[rank])
    assert torch.equal(y, base)
    assert close(gx, sum(grads.values())[2 * r:2 * r + 2])
    # ... and before replicated work: the gradient is already whole, backward only splits it.
    y, gx = run(lambda x: m.gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=False),
                base[2 * r:2 * r + 2], base * 10)
    assert torch.equal(y, base)
    assert torch.equal(gx, (base * 10)[2 * r:2 * r + 2])

    # Reduce-scatter after a row-parallel layer: sum, keep my part; backward all-gathers.
    grads = {g: base[:2] * scale(g) for g in members}
    y, gx = run(m.reduce_scatter_to_sequence_parallel_region, base * scale(rank), grads[rank])
    assert close(y, (base * sum(scale(g) for g in members))[2 * r:2 * r + 2])
    assert close(gx, torch.cat([grads[g] for g in members], dim=0))

    # The forward of g does not change the caller's tensor (it reduces a copy).
    x = base * scale(rank)
    m.reduce_from_tensor_model_parallel_region(x)
    assert torch.equal(x, base * scale(rank))
    return True


def test_each_mapping_forward_and_backward_on_its_tp_group():
    assert run_ranks(_check_all_mappings, world_size=4, tp=2) == [True] * 4


def _check_uneven_mappings(rank: int) -> bool:
    """The split-size variants MoE's dispatcher uses: rank r of each TP group holds r + 1 rows."""
    r = ps.get_tensor_model_parallel_rank()
    members = ps.get_global_ranks("tp")
    group = ps.get_tensor_model_parallel_group()
    sizes = [1, 2]
    rows = torch.arange(6, dtype=torch.float32).view(3, 2)                  # the group's 3 rows, h=2
    start, end = sum(sizes[:r]), sum(sizes[:r + 1])
    mine = rows[start:end]
    scale = lambda g: float(g + 1)

    def run(fn, x, grad):
        x = x.clone().requires_grad_()
        y = fn(x)
        y.backward(grad)
        return y.detach(), x.grad

    # Gather uneven blocks; backward sums the partial gradients and keeps my rows.
    grads = {g: rows * scale(g) for g in members}
    y, gx = run(lambda x: m.gather_from_sequence_parallel_region(x, group=group, output_split_sizes=sizes),
                mine, grads[rank])
    ok = torch.equal(y, rows) and torch.allclose(gx, sum(grads.values())[start:end])
    # Reduce-scatter into uneven blocks; backward gathers them.
    y, gx = run(lambda x: m.reduce_scatter_to_sequence_parallel_region(x, group=group, input_split_sizes=sizes),
                rows * scale(members[r]), mine * 10)
    ok &= torch.allclose(y, (rows * sum(scale(g) for g in members))[start:end])
    ok &= torch.equal(gx, rows * 10)
    # All-to-all: I send 1 row to rank 0 and 2 to rank 1; rank j sends me sizes[r] rows.
    send = torch.full((3, 2), float(members[r]))
    received = torch.cat([torch.full((sizes[r], 2), float(g)) for g in members])
    y, gx = run(lambda x: m.all_to_all(group, x, [sizes[r]] * 2, sizes), send, received * 10)
    ok &= torch.equal(y, received)
    ok &= torch.equal(gx, send * 10)   # each row's gradient went back to the rank that sent it
    return bool(ok)


def test_uneven_mappings_and_all_to_all_on_the_tp_group():
    assert run_ranks(_check_uneven_mappings, world_size=4, tp=2) == [True] * 4


def _check_sequence_split_error(rank: int) -> str:
    try:
        scatter_to_sequence_parallel_region(torch.zeros(3, 1, 2))
    except ValueError as err:
        return str(err)
    return "no error"


def test_uneven_sequence_split_says_what_is_wrong():
    message = run_ranks(_check_sequence_split_error, world_size=2, tp=2)[0]
    assert "sequence length" in message and "3 is not divisible by 2" in message
