"""The data path on real gloo ranks: build once behind a barrier; read once per TP group."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from distributed import run_ranks
import minitron.core.datasets  # noqa: F401  (imported here once, inherited by the forked ranks)
import minitron.training.data  # noqa: F401
from minitron.core.datasets import IndexedDatasetBuilder


def _corpus(tmp_path: Path) -> str:
    rng = np.random.default_rng(0)
    builder = IndexedDatasetBuilder(str(tmp_path / "c.bin"), dtype=np.uint16)
    for _ in range(60):
        builder.add_item(list(rng.integers(0, 100, size=rng.integers(5, 40))) + [100])
        builder.end_document()
    builder.finalize(str(tmp_path / "c.idx"))
    return str(tmp_path / "c")


def test_indices_built_once_and_loaded_after_the_barrier(tmp_path):
    prefix, cache = _corpus(tmp_path), str(tmp_path / "cache")

    def body(rank):
        from minitron.core.datasets import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig
        from minitron.pretrain_gpt import is_dataset_built_on_rank
        from minitron.training.tokenizer import NullTokenizer
        cfg = GPTDatasetConfig(random_seed=5, sequence_length=16, blend=([prefix], None), split="90,10,0",
                               path_to_cache=cache, tokenizer=NullTokenizer(100))
        train, valid, test = BlendedMegatronDatasetBuilder(GPTDataset, [100, 10, 0], is_dataset_built_on_rank,
                                                           cfg).build()
        if train is None:
            return None
        return train.built_anew_on_cache_miss, train.sample_index.tolist(), train[3]["tokens"].tolist()

    trace = tmp_path / "trace"
    results = run_ranks(body, world_size=4, tp=2, trace_dir=str(trace))
    # TP rank 0 (global ranks 0 and 2) needs data; ranks 1 and 3 get None.
    assert results[1] is None and results[3] is None
    assert results[0][0] is True and results[2][0] is False      # rank 0 built, rank 2 loaded
    assert results[0][1:] == results[2][1:]                       # ... the very same arrays
    # Every rank entered the same barriers (one per split), at different places in the code.
    barriers = {}
    for r in range(4):
        records = [json.loads(line) for line in (trace / f"rank{r}.jsonl").read_text().splitlines()]
        by_id = {rec["id"]: rec for rec in records}
        calls = [rec for rec in records if rec["name"].endswith("barrier")]
        barriers[r] = [by_id[rec["parent"]]["name"].rsplit(".", 1)[-1] for rec in calls]
    assert all(len(b) == 2 for b in barriers.values())
    assert barriers[0] == barriers[2] == ["build_generic_dataset"] * 2
    assert barriers[1] == barriers[3] == ["_build_megatron_dataset_splits"] * 2


def test_tp_rank_0_reads_and_broadcasts_to_the_stages_that_need_it():
    def body(rank):
        import torch
        from types import SimpleNamespace
        from minitron.core import parallel_state as mpu
        from minitron.core.datasets import BlendedMegatronDatasetBuilder, GPTDatasetConfig, MockGPTDataset
        from minitron.core.tensor_parallel import broadcast_data
        from minitron.pretrain_gpt import is_dataset_built_on_rank
        from minitron.training.datasets.data_samplers import build_pretraining_data_loader
        from minitron.training.tokenizer import NullTokenizer
        from minitron.training.utils import get_batch

        # broadcast_data on its own: TP rank 0's tensors arrive on the other TP rank.
        mine = {"x": torch.full((2, 3), float(rank))} if mpu.get_tensor_model_parallel_rank() == 0 else None
        got = broadcast_data(["x"], mine, torch.float32)["x"]
        assert torch.equal(got, torch.full((2, 3), float(mpu.get_tensor_model_parallel_src_rank())))

        cfg = GPTDatasetConfig(random_seed=1, sequence_length=8, tokenizer=NullTokenizer(50))
        train = BlendedMegatronDatasetBuilder(MockGPTDataset, [16, 4, 4], is_dataset_built_on_rank, cfg).build()[0]
        loader = build_pretraining_data_loader(
            train, 0, SimpleNamespace(micro_batch_size=2, dataloader_type="single", num_workers=0, seed=1234),
            mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size())
        iterator = None if loader is None else iter(loader)
        tokens, labels, loss_mask, attention_mask, position_ids = get_batch(iterator)
        as_list = lambda t: None if t is None else t.tolist()
        return {"reads": iterator is not None, "tokens": as_list(tokens), "labels": as_list(labels),
                "loss_mask": as_list(loss_mask), "mask": None if attention_mask is None else list(attention_mask.shape),
                "position_ids": as_list(position_ids)}

    r = run_ranks(body, world_size=4, tp=2, pp=2)   # stage 0: ranks 0, 1; stage 1: ranks 2, 3
    assert [x["reads"] for x in r] == [True, False, True, False]  # TP rank 0 of each stage
    # First stage: inputs only, identical on both TP ranks.
    assert r[0]["tokens"] == r[1]["tokens"] and r[0]["tokens"] is not None
    assert r[0]["labels"] is None and r[1]["loss_mask"] is None and r[1]["mask"] == [2, 1, 8, 8]
    # Last stage: labels and loss mask only, identical on both TP ranks.
    assert r[2]["labels"] == r[3]["labels"] and r[3]["loss_mask"] == [[1.0] * 8] * 2
    assert r[2]["tokens"] is None and r[3]["position_ids"] is None
    # Both stages read the same samples: the labels are the first stage's tokens shifted by one.
    assert [row[1:] for row in r[0]["tokens"]] == [row[:-1] for row in r[2]["labels"]]
