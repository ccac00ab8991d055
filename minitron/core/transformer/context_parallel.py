"""Context parallelism: causal attention over a sequence that is split across ranks.

Megatron hands this job to Transformer Engine's context-parallel attention; with
``--cp-comm-type p2p`` (the default) TE passes key/value blocks around the context-parallel
group in a ring. This file is that ring, in plain torch, on any backend, under TE's names:
attn_forward_func_with_cp (the entry) and AttnFuncWithCPAndKVP2P (its autograd Function).

The layout (training/utils.py, get_batch_on_this_cp_rank): the sequence is cut into 2 x cp
chunks and cp rank r holds chunks r and 2cp-1-r, its queries, keys and values alike. Causal
attention lets query chunk a see key chunk b only when b <= a, so one pair of chunks is

    full       b < a   every query sees every key
    diagonal   b = a   the usual causal triangle
    skipped    b > a   nothing to compute

The ring: in step t, rank r attends its queries to the keys/values that started on rank r-t,
while it already passes them on to rank r+1 and receives those of rank r-t-1 for step t+1.
After cp steps every rank has seen every key. Each step gives a partial softmax over a slice of
the keys; they merge exactly through each query row's log-sum-exp (``_merge``).

The balance: with the contiguous split (rank r holds chunks 2r and 2r+1) the last rank does
2cp - 1 times the work of the first; pairing an early chunk with a late one gives every rank the
same count, 2cp - 1 full blocks and 2 diagonal ones (``ring_plan``, ``count_blocks``).

Backward runs the ring again: the keys/values travel once more, and with them the gradient of
those keys/values, which every rank adds its share to; after cp hops it is back home.
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state
from minitron.core.tensor_parallel.random import get_cuda_rng_tracker
from minitron.trace import traced

FULL, DIAGONAL, SKIPPED = "full", "diagonal", "skipped"


def chunk_ids(cp_rank: int, cp_size: int, layout: str = "balanced") -> tuple[int, int]:
    """Which two of the 2 x cp sequence chunks a cp rank holds, in the order it holds them."""
    if layout == "balanced":
        return cp_rank, 2 * cp_size - 1 - cp_rank
    if layout == "contiguous":  # the naive split, kept to measure what the balanced one buys
        return 2 * cp_rank, 2 * cp_rank + 1
    raise ValueError(f"unknown context-parallel layout {layout!r}: balanced or contiguous")


def block_kind(query_chunk: int, key_chunk: int) -> str:
    """How causal attention treats one (query chunk, key chunk) pair."""
    if key_chunk < query_chunk:
        return FULL
    return DIAGONAL if key_chunk == query_chunk else SKIPPED


def ring_plan(cp_rank: int, cp_size: int, layout: str = "balanced") -> list[tuple[int, list]]:
    """The ring, step by step, from one rank's point of view.

    [(source rank, [(my query half, its key half, kind), ...]), ...]: in step t the keys and
    values in hand started on rank (cp_rank - t) mod cp. Forward and backward both walk this list.
    """
    mine = chunk_ids(cp_rank, cp_size, layout)
    plan = []
    for step in range(cp_size):
        source = (cp_rank - step) % cp_size
        theirs = chunk_ids(source, cp_size, layout)
        pairs = [(qi, ki, block_kind(qc, kc))
                 for qi, qc in enumerate(mine) for ki, kc in enumerate(theirs)]
        plan.append((source, pairs))
    return plan


def count_blocks(plan) -> dict:
    """{'full': n, 'diagonal': n, 'skipped': n} over a ring_plan."""
    counts = dict.fromkeys((FULL, DIAGONAL, SKIPPED), 0)
    for _, pairs in plan:
        for _, _, kind in pairs:
            counts[kind] += 1
    return counts


def _ring_exchange(send: torch.Tensor, group, ranks: list[int], cp_rank: int):
    """Post 'send to the next rank, receive from the previous one' on the cp group; return the
    receive buffer and the requests to wait on. Non-blocking, so it overlaps the step's compute."""
    cp_size = len(ranks)
    recv = torch.empty_like(send)
    ops = [torch.distributed.P2POp(torch.distributed.isend, send, ranks[(cp_rank + 1) % cp_size], group),
           torch.distributed.P2POp(torch.distributed.irecv, recv, ranks[(cp_rank - 1) % cp_size], group)]
    return recv, torch.distributed.batch_isend_irecv(ops)


def _wait(requests) -> None:
    for request in requests:
        request.wait()


def _scores(q, k, kind: str, scale: float) -> torch.Tensor:
    """q k^T / sqrt(d) for one block, the future hidden (-inf) on a diagonal block."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if kind == DIAGONAL:
        c = scores.size(-1)
        future = torch.ones(c, c, dtype=torch.bool, device=scores.device).triu_(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores


def _merge(out, lse, block_out, block_lse):
    """Fold one block's partial result into the running one.

    Each is softmax over its own slice of keys, times v, with lse = log sum exp of its scores.
    Over both slices together the normaliser is exp(lse_new) = exp(lse) + exp(block_lse), so
    each partial result is re-weighted by its share exp(lse_part - lse_new) and the two added.
    """
    if out is None:
        return block_out, block_lse
    new_lse = torch.logaddexp(lse, block_lse)
    share, block_share = torch.exp(lse - new_lse), torch.exp(block_lse - new_lse)
    return out * share.unsqueeze(-1) + block_out * block_share.unsqueeze(-1), new_lse


class AttnFuncWithCPAndKVP2P(torch.autograd.Function):
    """softmax(q k^T * scale, causal) v over the whole sequence; q, k, v hold this rank's two
    chunks, [b, n, 2c, d]. Computes in fp32 (or fp64, given fp64) and returns q's dtype."""

    @staticmethod
    def forward(ctx, q, k, v, scale, dropout_p, plan, group, ranks, cp_rank, fork_rng, stats):
        dtype, work = q.dtype, torch.promote_types(q.dtype, torch.float32)
        qs = q.to(work).chunk(2, dim=2)
        kv = torch.stack([k.to(work), v.to(work)])  # one message per hop: keys and values together
        outs, lses, masks = [None, None], [None, None], []
        for step, (_, pairs) in enumerate(plan):
            if step < len(plan) - 1:
                next_kv, requests = _ring_exchange(kv, group, ranks, cp_rank)
            ks, vs = kv[0].chunk(2, dim=2), kv[1].chunk(2, dim=2)
            for qi, ki, kind in pairs:
                if stats is not None:  # what this rank really did, block by block
                    stats[kind] = stats.get(kind, 0) + 1
                if kind == SKIPPED:
                    continue
                scores = _scores(qs[qi], ks[ki], kind, scale)
                block_lse = torch.logsumexp(scores, dim=-1)
                probs = torch.exp(scores - block_lse.unsqueeze(-1))
                if dropout_p > 0:
                    # Dropping after the block's own softmax is dropping after the whole one:
                    # the merge only rescales rows, and a mask commutes with that.
                    with fork_rng():
                        keep = torch.empty_like(probs).bernoulli_(1 - dropout_p)
                    masks.append(keep)
                    probs = probs * keep / (1 - dropout_p)
                outs[qi], lses[qi] = _merge(outs[qi], lses[qi], torch.matmul(probs, vs[ki]), block_lse)
            if step < len(plan) - 1:
                _wait(requests)
                kv = next_kv
        out = torch.cat(outs, dim=2)
        lse = torch.cat(lses, dim=2)
        ctx.save_for_backward(q, k, v, out, lse, *masks)
        ctx.scale, ctx.dropout_p, ctx.plan = scale, dropout_p, plan
        ctx.group, ctx.ranks, ctx.cp_rank = group, ranks, cp_rank
        return out.to(dtype)

    @staticmethod
    def backward(ctx, grad_out):
        return _ring_backward(ctx, grad_out)


@traced(name="minitron.core.transformer.context_parallel.AttnFuncWithCPAndKVP2P.backward",
        args=lambda ctx, grad_out: {"cp_rank": ctx.cp_rank, "blocks": count_blocks(ctx.plan)})
def _ring_backward(ctx, grad_out):
    """The ring once more, now carrying the key/value gradient too (see the module docstring)."""
    q, k, v, out, lse, *masks = ctx.saved_tensors
    scale, p, plan = ctx.scale, ctx.dropout_p, ctx.plan
    work = out.dtype
    qs, dos = q.to(work).chunk(2, dim=2), grad_out.to(work).chunk(2, dim=2)
    lses = lse.chunk(2, dim=2)
    # sum_j dP_ij P_ij over ALL keys of a row equals dO_i . O_i: the one cross-block term.
    deltas = (grad_out.to(work) * out).sum(-1).chunk(2, dim=2)
    dqs = [torch.zeros_like(qs[0]), torch.zeros_like(qs[1])]
    kv = torch.stack([k.to(work), v.to(work)])
    dkv = torch.zeros_like(kv)  # the gradient of the keys/values in hand; it travels with them
    masks = list(masks)
    for step, (_, pairs) in enumerate(plan):
        if step < len(plan) - 1:
            next_kv, requests = _ring_exchange(kv, ctx.group, ctx.ranks, ctx.cp_rank)
        ks, vs = kv[0].chunk(2, dim=2), kv[1].chunk(2, dim=2)
        dks, dvs = dkv[0].chunk(2, dim=2), dkv[1].chunk(2, dim=2)  # views: add_ lands in dkv
        for qi, ki, kind in pairs:
            if kind == SKIPPED:
                continue
            probs = torch.exp(_scores(qs[qi], ks[ki], kind, scale) - lses[qi].unsqueeze(-1))
            dprobs = torch.matmul(dos[qi], vs[ki].transpose(-2, -1))
            if p > 0:
                keep = masks.pop(0) / (1 - p)
                dvs[ki].add_(torch.matmul((probs * keep).transpose(-2, -1), dos[qi]))
                dprobs = dprobs * keep
            else:
                dvs[ki].add_(torch.matmul(probs.transpose(-2, -1), dos[qi]))
            dscores = probs * (dprobs - deltas[qi].unsqueeze(-1)) * scale
            dqs[qi] += torch.matmul(dscores, ks[ki])
            dks[ki].add_(torch.matmul(dscores.transpose(-2, -1), qs[qi]))
        # This step's key/value gradient moves on with the keys/values it belongs to; the
        # last hop brings every rank the finished gradient of its own keys and values.
        dkv, dkv_requests = _ring_exchange(dkv, ctx.group, ctx.ranks, ctx.cp_rank)
        _wait(dkv_requests)
        if step < len(plan) - 1:
            _wait(requests)
            kv = next_kv
    dq = torch.cat(dqs, dim=2).to(q.dtype)
    return dq, dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None, None, None, None


def _ring_group(cp_group=None):
    """(group, its global ranks, my place in it): the cp group's, or a2a+p2p's ring level's."""
    group = cp_group if cp_group is not None else parallel_state.get_context_parallel_group()
    return group, torch.distributed.get_process_group_ranks(group), torch.distributed.get_rank(group)


def _plan_args(query, key, value, softmax_scale, dropout_p=0.0, layout="balanced", fork_rng=None, stats=None,
               cp_group=None):
    _, ranks, cp_rank = _ring_group(cp_group)
    return {"cp_rank": cp_rank, "chunks": list(chunk_ids(cp_rank, len(ranks), layout)),
            "blocks": count_blocks(ring_plan(cp_rank, len(ranks), layout))}


@traced(args=_plan_args)
def attn_forward_func_with_cp(query, key, value, softmax_scale: float, dropout_p: float = 0.0,
                               layout: str = "balanced", fork_rng=None, stats: dict | None = None,
                               cp_group=None) -> torch.Tensor:
    """Causal attention of this cp rank's queries over the whole sequence's keys and values.

    query, key, value: [b, n, 2c, d], this rank's two chunks in ``chunk_ids`` order (the keys
    and values with as many heads as the queries). Returns [b, n, 2c, d] in query's dtype.
    ``fork_rng``: the context under which dropout draws its masks (default: the model-parallel
    RNG tracker's, as the unsplit attention does). ``stats``: a dict the forward fills with the
    number of blocks it computed or skipped, by kind. ``cp_group``: the ring's group when it is
    not the whole context-parallel group (a2a+p2p's second level, context_parallel_a2a.py).
    """
    group, ranks, cp_rank = _ring_group(cp_group)
    plan = ring_plan(cp_rank, len(ranks), layout)
    fork_rng = fork_rng or get_cuda_rng_tracker().fork
    return AttnFuncWithCPAndKVP2P.apply(query, key, value, softmax_scale, dropout_p, plan, group, ranks, cp_rank,
                                        fork_rng, stats)


def get_pos_emb_on_this_cp_rank(pos_emb: torch.Tensor, seq_dim: int) -> torch.Tensor:
    """A whole sequence's position table (rotary or learned), cut to this cp rank's two chunks:
    the positions of the tokens it holds are not 0..s/cp-1 but those of chunks r and 2cp-1-r."""
    cp_size = parallel_state.get_context_parallel_world_size()
    if cp_size == 1:
        return pos_emb
    index = torch.tensor(chunk_ids(parallel_state.get_context_parallel_rank(), cp_size), device=pos_emb.device)
    shape = pos_emb.shape
    chunked = pos_emb.view(*shape[:seq_dim], 2 * cp_size, shape[seq_dim] // (2 * cp_size), *shape[seq_dim + 1:])
    return chunked.index_select(seq_dim, index).reshape(*shape[:seq_dim], -1, *shape[seq_dim + 1:])
