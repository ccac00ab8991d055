"""Context parallelism by all-to-all (``--cp-comm-type a2a``): DeepSpeed-Ulysses' idea.

The ring (context_parallel.py) keeps each rank's queries and passes the keys and values round.
Ulysses turns the split around instead: attention heads are independent of one another, so if a
rank held *every* token of *some* heads, it could run ordinary causal attention on them with no
further exchange. One all-to-all gets there from the sequence split,

    before   rank r: all n heads,  its 2 chunks of the sequence    [b, n,    2c,      d]
    after    rank r: heads r·n/cp .. (r+1)·n/cp - 1,  all 2cp chunks  [b, n/cp, 2cp·c, d]

and one more brings the attention's output back to the sequence split. Each all-to-all moves
(cp-1)/cp of a tensor; the ring instead hands on the keys and values cp - 1 times. Megatron
hands this to Transformer Engine (AttnFuncWithCPAndQKVOA2A); the names here follow it.

The chunks arrive in rank order, rank i's being chunks i and 2cp-1-i (the balanced layout,
``chunk_ids``), so they are put back in sequence order before the causal attention and taken
out of it again after. The heads must split evenly: n/tp divisible by cp (validate_args).

With ``--cp-comm-type a2a+p2p`` (Megatron's hierarchical variant, with
``--hierarchical-context-parallel-sizes a p``) the all-to-all runs inside groups of a
neighbouring cp ranks and the ring across the p such groups. After the all-to-all, the a ranks
of group o together hold chunks o·a .. o·a+a-1 and their mirror images: sorted, that is chunk o
and chunk 2p-1-o of the sequence cut into 2p, exactly what the ring's rank o of p expects.
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state
from minitron.core.transformer.context_parallel import chunk_ids
from minitron.trace import traced


def _held_chunks(members, cp_size: int) -> list[int]:
    """The sequence chunk in each piece after an all-to-all among the cp ranks ``members``:
    piece 2i + j is chunk_ids(members[i])[j]."""
    return [chunk for rank in members for chunk in chunk_ids(rank, cp_size)]


def _exchange(blocks: torch.Tensor, group) -> torch.Tensor:
    """blocks [cp, ...]: block j goes to cp rank j; the answer's block i came from cp rank i."""
    received = torch.empty_like(blocks)
    torch.distributed.all_to_all_single(received, blocks, group=group)
    return received


@traced(args=lambda t, group, held: {"shape": list(t.shape)})
def _seq_to_heads(t: torch.Tensor, group, held: list[int]) -> torch.Tensor:
    """[b, n, 2c, d] (all heads, my two chunks) -> [b, n/g, 2g·c, d] (my heads, the g ranks'
    chunks in sequence order); ``held``: _held_chunks of the group's g members."""
    b, n, two_c, d = t.shape
    g = group.size()
    blocks = t.reshape(b, g, n // g, two_c, d).transpose(0, 1).contiguous()  # head part j -> member j
    received = _exchange(blocks, group)                                  # [g, b, n/g, 2c, d], by source
    pieces = received.unflatten(3, (2, two_c // 2)).permute(0, 3, 1, 2, 4, 5).flatten(0, 1)   # [2g, b, n/g, c, d]
    order = sorted(range(len(pieces)), key=held.__getitem__)            # pieces in sequence order
    return pieces[order].permute(1, 2, 0, 3, 4).flatten(2, 3)


@traced(args=lambda t, group, held: {"shape": list(t.shape)})
def _heads_to_seq(t: torch.Tensor, group, held: list[int]) -> torch.Tensor:
    """The inverse: [b, n/g, 2g·c, d] (my heads, the group's chunks) -> [b, n, 2c, d] (my two chunks)."""
    b, heads, s, d = t.shape
    g = group.size()
    chunks = t.unflatten(2, (2 * g, s // (2 * g))).permute(2, 0, 1, 3, 4)   # [2g, b, n/g, c, d], in order
    rank_of = {chunk: index for index, chunk in enumerate(sorted(held))}
    pieces = chunks[[rank_of[chunk] for chunk in held]]                 # piece 2i + j: member i's j-th chunk
    blocks = pieces.unflatten(0, (g, 2)).permute(0, 2, 3, 1, 4, 5).flatten(3, 4).contiguous()
    received = _exchange(blocks, group)                                  # [g, b, n/g, 2c, d], by head part
    return received.transpose(0, 1).flatten(1, 2)


class _AllToAll(torch.autograd.Function):
    """One of the two all-to-alls (``to_heads``: sequence split -> head split, else back); each
    is a permutation of data, so its gradient goes back by the other."""

    @staticmethod
    def forward(ctx, t, group, held, to_heads: bool):
        ctx.group, ctx.held, ctx.to_heads = group, held, to_heads
        return (_seq_to_heads if to_heads else _heads_to_seq)(t, group, held)

    @staticmethod
    def backward(ctx, grad):
        return (_heads_to_seq if ctx.to_heads else _seq_to_heads)(grad, ctx.group, ctx.held), None, None, None


@traced(args=lambda query, key, value, attention: {"cp_rank": parallel_state.get_context_parallel_rank(),
                                                   "heads": query.size(1)})
def attn_forward_func_with_cp_a2a(query, key, value, attention):
    """Causal attention over the whole sequence for ``query``, ``key``, ``value`` [b, n, 2c, d]
    (this rank's two chunks, all heads): all-to-all to whole-sequence heads, ``attention(q, k, v)``
    (the unsplit core attention, on [b, n/cp, s, d]), all-to-all back. Returns [b, n, 2c, d]."""
    group = parallel_state.get_context_parallel_group()
    held = _held_chunks(range(group.size()), group.size())
    q, k, v = (_AllToAll.apply(t, group, held, True) for t in (query, key, value))
    return _AllToAll.apply(attention(q, k, v), group, held, False)


@traced(args=lambda query, key, value, ring: {"cp_rank": parallel_state.get_context_parallel_rank(),
                                              "heads": query.size(1)})
def attn_forward_func_with_cp_a2a_p2p(query, key, value, ring):
    """a2a+p2p: the all-to-all inside my group of ``a`` neighbouring cp ranks, then
    ``ring(q, k, v, p2p_group)`` (context_parallel.attn_forward_func_with_cp) across the groups,
    then the all-to-all back. query, key, value: [b, n, 2c, d]; returns the same."""
    a2a_group, p2p_group = parallel_state.get_hierarchical_context_parallel_groups()
    cp_rank, a = parallel_state.get_context_parallel_rank(), a2a_group.size()
    first = cp_rank - cp_rank % a                                        # my a2a group: cp ranks first .. first+a-1
    held = _held_chunks(range(first, first + a), parallel_state.get_context_parallel_world_size())
    q, k, v = (_AllToAll.apply(t, a2a_group, held, True) for t in (query, key, value))
    return _AllToAll.apply(ring(q, k, v, p2p_group), a2a_group, held, False)
