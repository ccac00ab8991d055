"""Context parallelism: the ring attention equals plain causal attention, values and gradients,
and training with --context-parallel-size equals the serial run, iteration by iteration."""

import contextlib
import re

import pytest
import torch

from distributed import run_ranks
from minitron.core import parallel_state as ps
from minitron.core.transformer.context_parallel import (
    DIAGONAL, FULL, chunk_ids, attn_forward_func_with_cp, count_blocks, ring_plan,
)
from minitron.training.utils import get_batch_on_this_cp_rank
from test_training_equivalence import run


def test_the_balanced_layout_gives_every_rank_the_same_blocks():
    for cp in (2, 4, 8):
        counts = [count_blocks(ring_plan(r, cp)) for r in range(cp)]
        assert all(c == {FULL: 2 * cp - 1, DIAGONAL: 2, "skipped": 2 * cp - 1} for c in counts), counts
        contiguous = [count_blocks(ring_plan(r, cp, "contiguous")) for r in range(cp)]
        assert [c[FULL] for c in contiguous] == [4 * r + 1 for r in range(cp)]  # rank r: 4r + 1


def test_get_batch_on_this_cp_rank_keeps_chunks_r_and_2cp_minus_1_minus_r():
    tokens = torch.arange(16).view(1, 16)
    mask = torch.ones(1, 1, 16, 16, dtype=torch.bool).triu(1)
    got = get_batch_on_this_cp_rank({"tokens": tokens, "attention_mask": mask, "labels": None}, 1, 2)
    assert got["tokens"].tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]]
    assert got["labels"] is None
    assert torch.equal(got["attention_mask"], mask[:, :, 4:12, :])  # this rank's query rows only
    assert chunk_ids(1, 2) == (1, 2)


@pytest.mark.parametrize("world, flags, words", [
    (2, "--seq-length 6", "multiple of 2 x --context-parallel-size = 4"),
    (8, "--seq-length 20 --tensor-model-parallel-size 4 --num-attention-heads 4 --sequence-parallel",
     "make --seq-length a multiple of cp x tp = 8"),
    (2, "--reset-attention-mask", "drop one of --reset-attention-mask and --context-parallel-size"),
])
def test_validate_args_refuses_what_the_ring_cannot_do(world, flags, words):
    from test_arguments import validated
    from minitron.training.arguments import ArgumentError

    flags = ["--context-parallel-size", "2", "--seq-length", "8", "--micro-batch-size", "1", *flags.split()]
    with pytest.raises(ArgumentError, match=re.escape(words)):
        validated(world, *flags)
    validated(world // 2 * 2, "--context-parallel-size", "2", "--seq-length", "8", "--micro-batch-size", "1")


def _ring_vs_serial(rank: int, dropout: bool = False) -> float:
    torch.set_num_threads(1)
    cp = ps.get_context_parallel_world_size()
    b, n, s, d = 2, 3, 8 * cp, 4
    g = torch.Generator().manual_seed(11)
    q, k, v, grad = (torch.randn(b, n, s, d, generator=g) for _ in range(4))
    scale = d ** -0.5

    # Serial: the whole sequence on every rank.
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    causal = torch.ones(s, s, dtype=torch.bool).triu(1)
    probs = torch.softmax((full[0] @ full[1].transpose(-2, -1) * scale).masked_fill(causal, float("-inf")), -1)
    out = probs @ full[2]
    out.backward(grad)

    # Ring: this rank's two chunks of everything.
    def mine(t):
        return get_batch_on_this_cp_rank({"x": t.transpose(1, 2)})["x"].transpose(1, 2)
    local = [mine(t).clone().requires_grad_() for t in (q, k, v)]
    ring = attn_forward_func_with_cp(*local, scale)
    ring.backward(mine(grad))
    errors = [(ring - mine(out)).abs().max()]
    errors += [(a.grad - mine(f.grad)).abs().max() for a, f in zip(local, full)]
    return max(e.item() for e in errors)


@pytest.fixture(scope="module")
def cp2_ring():
    """On one launch of cp 2: the ring against causal attention, then the dropout derivatives
    (test_ring_attention_backward_with_dropout_matches_finite_differences) on the same ranks."""
    return run_ranks(lambda rank: (_ring_vs_serial(rank), _directional_derivatives_with_dropout(rank)),
                     world_size=2, cp=2)


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_equals_causal_attention(cp, request):
    if cp == 2:
        errors = [error for error, _ in request.getfixturevalue("cp2_ring")]
    else:
        errors = run_ranks(_ring_vs_serial, world_size=cp, cp=cp)
    assert max(errors) < 1e-5, errors


@contextlib.contextmanager
def _same_masks():
    """Dropout masks drawn from one fixed seed, so every evaluation of the function is the same."""
    with torch.random.fork_rng():
        torch.manual_seed(5)
        yield


def _directional_derivatives_with_dropout(rank: int) -> tuple[float, float]:
    """d/de of L(x + e u), L = sum over ranks of <ring output, G>, two ways: the ring's backward
    and central differences. x, u and G are whole-sequence tensors every rank draws alike; each
    rank feeds its own chunks. The masks come from a fixed seed, so L is one function of x."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(3)
    x, u = ([torch.randn(1, 2, 8, 2, generator=g, dtype=torch.float64) for _ in range(3)] for _ in range(2))
    cotangent = torch.randn(1, 2, 8, 2, generator=g, dtype=torch.float64)

    def mine(t):
        return get_batch_on_this_cp_rank({"x": t.transpose(1, 2)})["x"].transpose(1, 2)

    def loss(inputs):
        out = attn_forward_func_with_cp(*(mine(t) for t in inputs), 0.7, dropout_p=0.3, fork_rng=_same_masks)
        local = (out * mine(cotangent)).sum()
        total = local.detach().clone()
        torch.distributed.all_reduce(total)
        return local, total

    leaves = [t.clone().requires_grad_() for t in x]
    local, _ = loss(leaves)
    local.backward()
    analytic = torch.tensor(sum((leaf.grad * d).sum().item() for leaf, d in zip(leaves, u)))
    torch.distributed.all_reduce(analytic)  # each rank's leaves' grads hold what flowed to its chunks
    eps = 1e-6
    plus = loss([t + eps * d for t, d in zip(x, u)])[1]
    minus = loss([t - eps * d for t, d in zip(x, u)])[1]
    return analytic.item(), ((plus - minus) / (2 * eps)).item()


def test_ring_attention_backward_with_dropout_matches_finite_differences(cp2_ring):
    for analytic, numeric in (derivatives for _, derivatives in cp2_ring):
        assert analytic == pytest.approx(numeric, rel=1e-6), (analytic, numeric)


# --- training: every cp layout's per-iteration loss equals the serial run's -----------------------
# test_training_equivalence's model and launcher, smaller: 2 layers, 2 iterations of 2 samples.
SMALL = ["--num-layers", "2", "--global-batch-size", "2", "--train-iters", "2"]
CP_LAYOUTS = {
    "cp2": (2, []),
    "cp2-tp2": (4, ["--tensor-model-parallel-size", "2"]),
    "cp2-pp2": (4, ["--pipeline-model-parallel-size", "2"]),
    "cp2-dp2-tp2-sp": (8, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    # Megatron's per-layer list: the hierarchical kind (all-to-all in pairs, a ring of two
    # pairs) in the first layer, the all-to-all over all four in the second; cp 4 so that the
    # all-to-all reorders 8 chunks, not just 4
    "cp4-a2a+p2p-a2a": (4, ["--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p", "a2a",
                            "--hierarchical-context-parallel-sizes", "2", "2"]),
}


@pytest.fixture(scope="module")
def serial_small(tmp_path_factory):
    return run(tmp_path_factory.mktemp("serial"), "serial", 1, *SMALL)


@pytest.mark.parametrize("name", list(CP_LAYOUTS))
def test_context_parallel_training_matches_serial(tmp_path, serial_small, name):
    world, flags = CP_LAYOUTS[name]
    losses = run(tmp_path, name, world, *SMALL, "--context-parallel-size", "2", *flags)
    assert len(losses) == 2
    assert losses == pytest.approx(serial_small, rel=1e-5, abs=0), f"{name}: {losses} vs serial {serial_small}"
    assert losses[-1] != losses[0]  # the weights really changed between iterations


def test_rotary_positions_follow_the_chunks(tmp_path):
    # Rank r holds chunks r and 2cp-1-r, so its rotary angles must be those positions' angles
    # (get_pos_emb_on_this_cp_rank), not 0..s/cp-1: a wrong cut would change the loss.
    rope = [*SMALL, "--position-embedding-type", "rope"]
    serial = run(tmp_path, "serial-rope", 1, *rope)
    losses = run(tmp_path, "cp2-rope", 2, *rope, "--context-parallel-size", "2")
    assert losses == pytest.approx(serial, rel=1e-5, abs=0), f"rope cp2: {losses} vs serial {serial}"
