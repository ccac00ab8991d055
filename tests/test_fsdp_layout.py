"""Megatron-FSDP's unit layout (core/distributed/fsdp/buffer_index.py): a hand-worked example,
and the units of a real wrapper at dp 2 (tests/test_fsdp_layout_mcore.py holds the same
layouts against Megatron-Core's own code).

The example, worked by hand from the rules in buffer_index.py. Five parameters registered as
n (4,), b (5, 4), w (3, 6), v (6,), c (2, 4):

* order, widest row first, ties kept: w (row 6), b, c (row 4), n, v (row 1);
* chunk: starts at 6; b's row 4 does not divide 6 and b (20 elements) is neither under 6 nor a
  multiple of it, so the chunk becomes lcm(6, 4) = 12; c (8 < 12), n and v fit it;
* placement: w at 0 (18 elements: one chunk and 6 of the next), the next boundary is 24; b's
  leftover (20 % 12 = 8) does not fit beside w's 6, so no partner; the small ones fill w's
  6 free elements in order: c (8) does not fit, n (4) goes at 18, v (6) does not fit in the 2
  left. b at 24 (44, next boundary 48; 4 free, nothing fits). c at 48, v at 56: 62 elements;
* dp 2: padded to a multiple of 2 x 12 = 24, 72; shards [0, 36) and [36, 72), and 36 is a
  boundary of b's rows (24 + 3 x 4). no_shard: 62, nothing padded.

A second, (5, 6) then (4, 4) then (2,): chunk 12 again; the (4, 4)'s leftover of 4 fits beside
the (5, 6)'s 6, so it starts at 36 - 4 = 32 (its rows at 32, 36, 40, 44: whole at the boundary),
and the (2,) fills the 2 elements left at 30.
"""

from __future__ import annotations

import pytest
import torch

from distributed import run_ranks
from minitron.core.distributed.fsdp.buffer_index import build_buffer_index


@pytest.mark.parametrize("shapes, dp, sharded, order, offsets, size, shards", [
    ([(4,), (5, 4), (3, 6), (6,), (2, 4)], 2, True, (2, 1, 4, 0, 3), (18, 24, 0, 56, 48), 72, [(0, 36), (36, 72)]),
    ([(4,), (5, 4), (3, 6), (6,), (2, 4)], 3, True, (2, 1, 4, 0, 3), (18, 24, 0, 56, 48), 72,
     [(0, 24), (24, 48), (48, 72)]),
    ([(4,), (5, 4), (3, 6), (6,), (2, 4)], 2, False, (2, 1, 4, 0, 3), (18, 24, 0, 56, 48), 62, None),
    ([(5, 6), (4, 4), (2,)], 2, True, (0, 1, 2), (0, 32, 30), 48, [(0, 24), (24, 48)]),
])
def test_hand_worked_layouts(shapes, dp, sharded, order, offsets, size, shards):
    index = build_buffer_index(shapes, dp, sharded)
    assert (index.chunk, index.order, index.offsets, index.size) == (12, order, offsets, size)
    if shards:
        assert [index.shard(r) for r in range(dp)] == shards


def _units(rank):
    """Each unit of a 2-layer GPT (h 32, ffn 71) wrapped at dp 2: its layout, this rank's
    [lo, hi), and whether this rank's shard holds the model's values (gaps and padding zero)."""
    from minitron.core.distributed.fsdp import FullyShardedDataParallel
    from minitron.core.models.gpt import GPTModel
    from minitron.core.transformer import TransformerConfig

    config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=71, init_seed=3)
    model = GPTModel(config, 64, 16)
    before = {name: p.detach().clone().view(-1) for name, p in model.named_parameters()}
    names = {p: name for name, p in model.named_parameters()}
    fsdp = FullyShardedDataParallel(config, model, "optim_grads_params")
    out = []
    for unit in fsdp.units:
        expected = torch.zeros(unit.shard_size)   # the model's values where they lie, zeros elsewhere
        for p in unit.params:
            start = unit.offsets[p]
            lo, hi = max(start, unit.lo), min(start + p.numel(), unit.hi)
            if lo < hi:
                expected[lo - unit.lo:hi - unit.lo] = before[names[p]][lo - start:hi - start]
        out.append({"name": unit.name, "chunk": unit.index.chunk, "lo": unit.lo, "hi": unit.hi,
                    "size": unit.flat.numel(), "holds": torch.equal(unit.shard, expected),
                    "params": [(names[p], tuple(p.shape), unit.offsets[p]) for p in unit.params]})
    return out


@pytest.fixture(scope="module")
def units():
    return run_ranks(_units, world_size=2)


def test_each_rank_holds_its_shard_of_the_layout(units):
    for rank, mine in enumerate(units):
        for unit in mine:
            shapes = [shape for _, shape, _ in unit["params"]]
            index = build_buffer_index(shapes, 2)
            assert [o for _, _, o in unit["params"]] == list(index.offsets) and unit["size"] == index.size
            assert (unit["lo"], unit["hi"]) == index.shard(rank) and unit["holds"], unit["name"]


def test_shard_boundaries_keep_rows_whole(units):
    """A parameter of a chunk or more starts on a chunk boundary or on one of its rows, so no
    shard boundary (a chunk boundary) cuts a row of it; together the ranks hold each element once."""
    cut = 0
    for k, unit in enumerate(units[0]):
        bounds = [units[r][k]["lo"] for r in (0, 1)] + [unit["size"]]
        for name, shape, start in unit["params"]:
            numel, row = torch.Size(shape).numel(), torch.Size(shape[1:]).numel()
            inside = [b for b in bounds if start < b < start + numel]
            cut += bool(inside)
            if numel >= unit["chunk"]:
                assert all((b - start) % row == 0 for b in inside), (unit["name"], name, inside)
    layer = units[0][0]
    assert layer["chunk"] == 2272 and layer["size"] == 4 * 2272   # lcm(71, 32); 8 chunks' elements, padded to 4 x 2
    assert cut > 0   # some parameters do span two ranks: the rows held them whole
