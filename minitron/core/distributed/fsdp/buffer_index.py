"""Where each parameter of a Megatron-FSDP unit sits in the unit's flat buffer, and which part of
that buffer each data-parallel rank owns.

Megatron-Core 0.19.2 decides this from the parameters' shapes alone (megatron_fsdp's
param_and_grad_buffer.py: the chunk size of _get_parameter_groups, then
build_data_parallel_buffer_index), and so does minitron, by the same rules:

1. The *chunk size* c. The parameters are taken widest row first (a row: one index of dim 0,
   shape[1:]'s elements; a vector's row is one element); c starts as the widest row and grows
   to the least common multiple with each row that does not divide it, unless that row's
   parameter is smaller than c.
2. The *placement*, in that order. A parameter of at least c elements starts on a chunk boundary
   and the next one starts on the next boundary after it. Its last chunk, if it is only part
   full, is shared: with the first later parameter whose own leftover (elements beyond whole
   chunks) fits beside it, placed so that its leftover fills the end of that chunk and its
   whole chunks follow; and then with the small parameters (fewer than c elements), in order,
   each that still fits. The small ones left over go at the end, end to end.
3. The *padding*. Sharded, the buffer is padded to a multiple of dp * c and rank r owns the
   r-th of its dp equal shards: every shard boundary is a chunk boundary. With no_shard nothing
   is padded (nothing is cut).

Why chunks: a rank's shard then holds whole rows of every parameter that starts on a boundary
(its rows divide c), so a row-wise operation (a quantization scale per row, a row-wise
optimizer) needs no neighbour's elements. The price is padding, up to dp * c - 1 elements per
unit: a unit whose rows are 71 and 32 wide has c = 2272 (see walkthrough chapter 12).

Torch-free: the memory estimator lays units out from shapes alone (training/theoretical_fsdp.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def row_size(shape) -> int:
    """Elements in one row (one index of dim 0): the product of shape[1:]; 1 for a vector."""
    return math.prod(shape[1:])


def chunk_size_factor(shapes) -> tuple[list[int], int]:
    """(the parameters' order in the buffer, as indices into ``shapes``; the chunk size c)."""
    # widest row first; a stable sort, so equal rows keep the module's order (Megatron's sorted())
    order = sorted(range(len(shapes)), key=lambda i: -row_size(shapes[i]))
    chunk = row_size(shapes[order[0]]) if shapes else 1
    for i in order:
        numel, row = math.prod(shapes[i]), row_size(shapes[i])
        # Megatron's test, as it reads; in effect c grows only for a row that does not divide
        # it, of a parameter of at least c elements (a smaller one is placed inside a chunk)
        fits = row == chunk or (chunk % row == 0 and numel % chunk == 0) or numel < chunk
        if not fits:
            chunk = math.lcm(chunk, row)
    return order, chunk


@dataclass(frozen=True)
class BufferIndex:
    order: tuple        # indices into the shapes, in the order they were placed
    chunk: int          # c, the chunk size
    offsets: tuple      # offsets[i]: where parameter i's first element sits in the buffer
    size: int           # the buffer's elements, padding included
    dp: int
    sharded: bool

    @property
    def shard_size(self) -> int:
        """Elements per rank: size / dp sharded; unsharded, the ceiling (each rank's range for
        writing a checkpoint once; Megatron's own unsharded "virtual shard" rounds down)."""
        return self.size // self.dp if self.sharded else -(-self.size // self.dp)

    def shard(self, rank: int) -> tuple[int, int]:
        """[lo, hi) of the buffer that ``rank`` owns."""
        return rank * self.shard_size, min(self.size, (rank + 1) * self.shard_size)


def build_buffer_index(shapes, dp: int, sharded: bool = True) -> BufferIndex:
    """Lay out parameters of these shapes in one unit's buffer over ``dp`` ranks (rules above)."""
    shapes = [tuple(s) for s in shapes]
    order, chunk = chunk_size_factor(shapes)
    numel = [math.prod(s) for s in shapes]
    small = [i for i in order if numel[i] < chunk]
    large = [i for i in order if numel[i] >= chunk]
    offsets = [0] * len(shapes)
    end = 0   # the next free element; always a chunk boundary between parameters
    while large:
        i = large.pop(0)
        offsets[i] = end
        left = numel[i] % chunk
        if left == 0:
            end += numel[i]
            continue
        gap = end + numel[i]            # the free tail of i's last chunk starts here
        end += numel[i] - left + chunk  # the next chunk boundary
        space = chunk - left
        partner = next((j for j in large if numel[j] % chunk and left + numel[j] % chunk <= chunk), None)
        if partner is not None:
            # its leftover ends the shared chunk, its whole chunks follow: its rows stay aligned
            # (its row divides c and its leftover), so no row of it crosses a boundary
            large.remove(partner)
            tail = numel[partner] % chunk
            offsets[partner] = end - tail
            space -= tail
            end += numel[partner] - tail
        for j in list(small):   # then what is small enough, in order
            if numel[j] <= space:
                offsets[j] = gap
                gap += numel[j]
                space -= numel[j]
                small.remove(j)
    for j in small:
        offsets[j] = end
        end += numel[j]
    size = -(-end // (dp * chunk)) * dp * chunk if sharded else end
    return BufferIndex(tuple(order), chunk, tuple(offsets), size, dp, sharded)


def parameter_buckets(keys, numels, bucket_size: int | None) -> list[tuple[object, list[int]]]:
    """Megatron-FSDP's buckets of parameters that belong to no unit module (_get_parameter_groups):
    [(key, indices into ``keys``)]. Parameters of one kind (``keys[i]``: Megatron's dtype and
    expert-or-not) go together in the module's order, whatever lies between them; a bucket closes
    after the parameter that brings it to ``bucket_size`` elements or more. None: one bucket per
    kind, as Megatron's bucket size is None without --overlap-grad-reduce."""
    kinds: dict = {}   # insertion order: kinds in the order their first parameter comes
    for i, key in enumerate(keys):
        kinds.setdefault(key, []).append(i)
    buckets = []
    for key, members in kinds.items():
        bucket, size = [], 0
        for i in members:
            bucket.append(i)
            size += numels[i]
            if bucket_size and size >= bucket_size:
                buckets.append((key, bucket))
                bucket, size = [], 0
        if bucket:
            buckets.append((key, bucket))
    return buckets
