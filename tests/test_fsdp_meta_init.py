"""--init-model-with-meta-device: Megatron-FSDP builds nothing full-size, and the same weights.

On 4 forked ranks a 16-layer GPT (hidden 32) is built twice through model_setup's chunk
builder and wrapped in FullyShardedDataParallel (optim_grads_params): normally, and as shapes
whose units are then built one at a time (fsdp/meta_init.py). The CPU allocator's own count
(torch.profiler's memory events: every allocation and free, with the total live after it)
gives each build's peak:

* the normal build's peak holds at least the whole model (measured: 897 KB, the model 846 KB);
* the meta build's peak (measured: 488 KB) stays under what FSDP keeps, this rank's shards of
  the parameters and of the gradients (2 x 212 KB: 2/dp of the model), plus three of the
  largest unit (51 KB: the rebuilt unit, its flat buffer, slack for one matrix drawn whole),
  and under 3/4 of the model. dp 4 and 16 layers, because at dp 2 the gradient shards alone
  are as big as the model;
* the weights are bit for bit the normal build's (each layer draws from a generator seeded by
  the run's seed and its index only, so building it alone draws the same numbers), so the
  losses are too: the stress case of test_fsdp_parallel.py trains it at dp 4 to the serial run's.
"""

from __future__ import annotations

import json

import pytest

from distributed import run_ranks
from minitron.cli.common import UserError, validate_pretrain

LAYERS, HIDDEN, VOCAB, SEQ = 16, 32, 128, 16
WORLD = 4


def _peak_bytes(fn, trace_path):
    """(fn's result, the most bytes the CPU allocator held at once while it ran, counted from its start)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    prof.export_chrome_trace(str(trace_path))
    events = [e["args"] for e in json.load(open(trace_path))["traceEvents"] if e.get("name") == "[memory]"]
    start = events[0]["Total Allocated"] - events[0]["Bytes"]
    return result, max(e["Total Allocated"] for e in events) - start


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    out = tmp_path_factory.mktemp("meta")

    def body(rank):
        import torch

        from minitron.core.distributed.fsdp import FullyShardedDataParallel
        from minitron.core.models.gpt import GPTModel
        from minitron.core.transformer import TransformerConfig
        from minitron.training.model_setup import _chunk_builder

        config = TransformerConfig(num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=4, init_seed=5)

        def provider(pre_process, post_process, vp_stage):
            return GPTModel(config, VOCAB, SEQ, pre_process, post_process, position_embedding_type="rope")

        def normal():
            return FullyShardedDataParallel(config, _chunk_builder(provider, None)(), "optim_grads_params")

        def meta():
            build = _chunk_builder(provider, None)
            return FullyShardedDataParallel(config, build(keep=lambda index: False), "optim_grads_params",
                                            rebuild=build)

        plain, plain_peak = _peak_bytes(normal, out / f"normal{rank}.json")
        shaped, meta_peak = _peak_bytes(meta, out / f"meta{rank}.json")
        with plain.gathered():
            want = {k: v.clone() for k, v in plain.module.state_dict().items()}
        with shaped.gathered():
            same = all(torch.equal(v, want[k]) for k, v in shaped.module.state_dict().items())
        return {"plain_peak": plain_peak, "meta_peak": meta_peak, "same": same,
                "model": sum(u.numel for u in plain.units) * 4,
                "shards": sum(u.shard_size for u in plain.units) * 4,
                "unit": max(u.flat.numel() for u in plain.units) * 4,
                "meta_left": [n for n, p in shaped.module.named_parameters() if p.is_meta]}

    return run_ranks(body, world_size=WORLD)


def test_the_weights_are_the_normal_builds_bit_for_bit(builds):
    for rank in builds:
        assert rank["same"] and rank["meta_left"] == []


def test_the_normal_build_holds_the_whole_model(builds):
    for rank in builds:
        assert rank["plain_peak"] >= rank["model"]


def test_the_meta_build_holds_shards_and_a_few_units(builds):
    for rank in builds:
        # what FSDP keeps (a shard of each unit's parameters and of its gradients), plus about
        # two of the largest unit at a time, and slack for one matrix drawn whole
        assert rank["meta_peak"] <= 2 * rank["shards"] + 3 * rank["unit"], rank
        assert rank["meta_peak"] < 0.75 * rank["model"], rank


@pytest.mark.parametrize("extra, words", [
    (["--data-parallel-sharding-strategy", "no_shard"], "no_shard"),
    (["--pipeline-model-parallel-size", "2"], "--pipeline-model-parallel-size 1"),
])
def test_what_meta_init_does_not_build_is_refused(extra, words):
    argv = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
            "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "1", "--mock-data",
            "--vocab-size", "1023", "--use-megatron-fsdp", "--init-model-with-meta-device", *extra]
    with pytest.raises(UserError, match=words) as refused:
        validate_pretrain(argv, 2)
    assert "\n" not in str(refused.value)


def test_meta_init_without_fsdp_is_refused():
    with pytest.raises(UserError, match="add --use-megatron-fsdp"):
        validate_pretrain(["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                           "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "4",
                           "--train-iters", "1", "--mock-data", "--vocab-size", "1023",
                           "--init-model-with-meta-device"], 2)

