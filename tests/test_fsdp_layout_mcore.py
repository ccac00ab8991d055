"""Megatron-FSDP's unit layout held against Megatron-Core 0.19.2's own code (marked mcore).

Megatron-FSDP decides where each parameter sits in a unit's buffer, how much padding the
buffer gets and which part each data-parallel rank owns from the parameters' shapes alone
(megatron_fsdp/param_and_grad_buffer.py): _get_parameter_groups makes the units (with
optim_grads_params one per fsdp_unit_module, the transformer layers, plus the rest; with the other
three strategies mcore_fsdp_adapter.py passes no unit modules, so the whole chunk is one bucket
per kind, cut at the bucket size where there is one), orders each unit's parameters and picks its
chunk size; build_data_parallel_buffer_index places them and cuts the buffer. Both are
plain Python over shapes, so they run here, on minitron's own GPT modules: the same parameter
objects in the same modules.

For three small GPTs (h 32 with ffn 71, whose rows 71 and 32 make a chunk of 2272 with gaps the
small parameters fill; the llama case of test_mcore_peer.py; 4 SequentialMLP experts) this holds,
for each of the four strategies, and for optim with --overlap-grad-reduce and a bucket of 5000
elements (the embedding a bucket alone, the layers' parameters cut across layers):

* minitron's FullyShardedDataParallel makes Megatron's units, parameter for parameter (its
  experts a unit of their own, as Megatron splits ".experts." parameters off);
* each unit's chunk size, each parameter's offset in the buffer and the buffer's size equal
  Megatron's, at dp 1 from the units minitron built and at dp 2, 3 and 4 from buffer_index.py,
  the function FSDPUnit lays itself out with;
* sharded, every rank's [start, end) of the buffer equals Megatron's shard.

The GPTs' units exercise the chunk's growth to a least common multiple and the gaps the small
parameters fill, but not every rule; so 200 lists of random shapes (1 to 8 tensors of 1 to 3
dims, dims of 1 to 71), seeded, are held the same way at dp 1 to 4, every rank, both strategies:
the pairing of two parameters' leftovers in one chunk happens in 16 of them.

The gradient and main-weight buffers are laid out by the same call on the same shapes (their
dtype enters only the allocation), so one layout per unit covers them.
"""

from __future__ import annotations

import math
import random
import warnings

import pytest
import torch

from test_mcore_peer import CASES, SEQ, SHAPE, _free_port

pytestmark = pytest.mark.mcore
with warnings.catch_warnings():   # Megatron warns that apex and TE are absent: known, CPU
    warnings.simplefilter("ignore")
    from megatron.core.distributed.fsdp.src.megatron_fsdp.distributed_data_parallel_config import (  # noqa: E402
        DistributedDataParallelConfig as McoreFSDPConfig)
    from megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer import (  # noqa: E402
        BucketingPolicy, _get_parameter_groups, build_data_parallel_buffer_index)

from minitron.core import parallel_state   # noqa: E402
from minitron.core.distributed.fsdp import FullyShardedDataParallel   # noqa: E402
from minitron.core.distributed.fsdp.buffer_index import build_buffer_index   # noqa: E402
from minitron.core.models.gpt import GPTModel   # noqa: E402
from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed   # noqa: E402
from minitron.core.transformer import TransformerConfig   # noqa: E402
from minitron.core.transformer.transformer_layer import TransformerLayer   # noqa: E402

VOCAB = 1023
MODELS = {  # name: (TransformerConfig fields, GPTModel arguments)
    "gpt-ffn71": (dict(ffn_hidden_size=71), {}),
    "llama": (dict(CASES["llama"][0]), CASES["llama"][1]),
    "moe": (dict(num_moe_experts=4, moe_router_topk=2, add_bias_linear=False), {}),
}
STRATEGIES = ("optim_grads_params", "optim_grads", "optim", "no_shard")
BUCKETED = ("optim", 5000)   # --overlap-grad-reduce --ddp-bucket-size 5000
RUNS = [(strategy, None) for strategy in STRATEGIES] + [BUCKETED]
DPS = (2, 3, 4)


def _megatron(model, strategy, bucket_size=None):
    """Megatron's units of ``model`` for ``strategy``: [(its parameters in buffer order, chunk size)].
    The unit modules as mcore_fsdp_adapter.py picks them; the bucket size as get_model resolves it
    (None without --overlap-grad-reduce; BucketingPolicy's own default, 40M, is never the one used)."""
    units = [TransformerLayer] if strategy == "optim_grads_params" else []
    policy = BucketingPolicy(suggested_bucket_size=bucket_size, fsdp_unit_modules=units,
                             data_parallel_sharding_strategy=strategy)
    groups, _, _ = _get_parameter_groups(model, policy, {})
    return [(list(g.params), g.chunk_size_factor) for g in groups]


def _megatron_index(params, chunk, strategy, dp, rank):
    """({param: offset}, buffer size, (shard start, end)) from build_data_parallel_buffer_index."""
    items, bucket, shard = build_data_parallel_buffer_index(
        [p.shape for p in params], rank, dp, True, McoreFSDPConfig(data_parallel_sharding_strategy=strategy),
        chunk_size_factor=chunk)
    offsets = {p: items[k].global_data_index for k, p in enumerate(params)}
    return offsets, bucket.size, (shard.global_data_index, shard.global_data_index + shard.size)


@pytest.fixture(scope="module")
def compared():
    """Per model and strategy: (minitron's units at dp 1, Megatron's units), built in a world
    of one (gloo): minitron's wrapper asks its groups for dp and rank."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(5)
    try:
        out = {}
        for name, (fields, model_args) in MODELS.items():
            config = TransformerConfig(**{**SHAPE, **fields}, init_seed=3)
            for strategy, bucket in RUNS:
                model = GPTModel(config, VOCAB, SEQ, **model_args)
                theirs = _megatron(model, strategy, bucket)   # before FSDP makes the parameters views
                fsdp = FullyShardedDataParallel(config, model, strategy, bucket_size=bucket,
                                                overlap_grad_reduce=bucket is not None)
                out[name, strategy, bucket] = fsdp.units, theirs
        return out
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", list(MODELS))
def test_minitron_makes_megatrons_units(compared, name, run):
    ours, theirs = compared[(name, *run)]
    assert sorted(sorted(map(id, u.params)) for u in ours) == sorted(sorted(map(id, params)) for params, _ in theirs)
    layers = 2 + (name == "moe") * 2   # each layer, and an MoE layer's experts, a unit of its own
    assert len(ours) == {"optim_grads_params": layers + 1, None: 1 + (name == "moe")}.get(run[0], len(ours))
    if run == BUCKETED:   # cut by size: more buckets than kinds, none past the size but by its last parameter
        assert len(ours) > 1 + (name == "moe")
        assert all(u.numel - u.params[-1].numel() < BUCKETED[1] for u in ours)
    if name == "moe":
        assert any(u.name.endswith("(experts)") for u in ours)


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", list(MODELS))
def test_offsets_padding_and_shards_are_megatrons(compared, name, run):
    units, theirs = compared[(name, *run)]
    strategy = run[0]
    by_params = {frozenset(map(id, u.params)): u for u in units}
    agreed = 0
    for params, chunk in theirs:
        unit = by_params[frozenset(map(id, params))]
        ids = [id(p) for p in unit.params]
        assert unit.index.chunk == chunk
        assert list(unit.index.order) == [ids.index(id(p)) for p in params]
        offsets, size, _ = _megatron_index(params, chunk, strategy, 1, 0)
        assert unit.flat.numel() == size and unit.offsets == offsets
        for dp in DPS:
            ours = build_buffer_index([p.shape for p in unit.params], dp, strategy != "no_shard")
            for rank in range(dp):
                offsets, size, shard = _megatron_index(params, chunk, strategy, dp, rank)
                assert ours.size == size and dict(zip(unit.params, ours.offsets)) == offsets
                if strategy != "no_shard":
                    assert ours.shard(rank) == shard
                    assert shard[1] - shard[0] == size // dp and (shard[1] - shard[0]) % chunk == 0
        agreed += len(params)
    assert agreed == sum(len(u.params) for u in units)
    if name == "gpt-ffn71" and run == ("optim_grads_params", None):   # the chunk is lcm(71, 32): gaps and padding
        layer = next(u for u in units if u.name.endswith("layers.0"))
        assert layer.index.chunk == math.lcm(71, 32) and layer.flat.numel() > layer.numel


def _random_shapes(rng):
    dims = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 71)
    return [tuple(rng.choice(dims) for _ in range(rng.choice((1, 1, 2, 2, 2, 3)))) for _ in range(rng.randint(1, 8))]


def test_random_shapes_are_laid_out_as_megatron_lays_them():
    rng, paired = random.Random(0), 0
    for trial in range(200):
        shapes = _random_shapes(rng)
        module = torch.nn.Module()   # a unit of these shapes, on the meta device: shapes only
        module.held = torch.nn.ParameterList(torch.nn.Parameter(torch.empty(s, device="meta")) for s in shapes)
        position = {id(p): i for i, p in enumerate(module.held)}
        for strategy in ("optim_grads_params", "no_shard"):   # the layout tells only sharded from not
            [(params, chunk)] = _megatron(module, strategy)
            for dp in (1, *DPS):
                ours = build_buffer_index(shapes, dp, strategy != "no_shard")
                assert (ours.chunk, [position[id(p)] for p in params]) == (chunk, list(ours.order)), shapes
                for rank in range(dp):
                    offsets, size, shard = _megatron_index(params, chunk, strategy, dp, rank)
                    assert {position[id(p)]: o for p, o in offsets.items()} == dict(enumerate(ours.offsets)), shapes
                    assert ours.size == size, shapes
                    assert strategy == "no_shard" or ours.shard(rank) == shard, (shapes, dp, rank)
        large = [i for i, s in enumerate(shapes) if math.prod(s) >= ours.chunk]
        paired += any(ours.offsets[i] % ours.chunk for i in large)   # a leftover that ends another's chunk
    assert paired >= 10   # the pairing rule was exercised (16 of the 200 with this seed)
