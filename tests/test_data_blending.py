"""Blends: the greedy index keeps every prefix near the weights; the builder wires it up."""

from __future__ import annotations

import numpy as np
import pytest

from minitron.core.datasets import (
    BlendedDataset, BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig, IndexedDatasetBuilder,
    get_blend_from_list,
)
from minitron.core.datasets.blended_megatron_dataset_config import (
    convert_split_vector_to_split_matrix, parse_and_normalize_split,
)
from minitron.core.datasets.helpers import build_blending_indices, build_exhaustive_blending_indices
from minitron.training.tokenizer import NullTokenizer


def test_blending_ratios_hold_at_every_prefix():
    weights = [0.2, 0.5, 0.3]
    dataset_index, sample_index = build_blending_indices(weights, 1000)
    counts = np.zeros(3)
    for t, d in enumerate(dataset_index):
        counts[d] += 1
        # The greedy choice never lets a dataset fall more than one sample behind its share.
        assert np.all(np.abs(counts - np.array(weights) * (t + 1)) <= 1.0 + 1e-9)
    # Each dataset's samples are taken in order 0, 1, 2, ...
    for d in range(3):
        assert sample_index[dataset_index == d].tolist() == list(range(int(counts[d])))


def test_exhaustive_blend_uses_every_sample_once():
    dataset_index, sample_index = build_exhaustive_blending_indices([5, 0, 12])
    assert np.bincount(dataset_index, minlength=3).tolist() == [5, 0, 12]
    assert sample_index[dataset_index == 2].tolist() == list(range(12))


def test_split_and_blend_parsing():
    assert parse_and_normalize_split("969, 30, 1") == pytest.approx([0.969, 0.03, 0.001])
    # Megatron's llama3 and gpt-oss scripts leave the shell's quotes in the value
    assert parse_and_normalize_split("'99,1,0'") == pytest.approx([0.99, 0.01, 0.0])
    assert convert_split_vector_to_split_matrix([0.5, 0.5, 0.0]) == [(0.0, 0.5), (0.5, 1.0), None]
    assert get_blend_from_list(["0.3", "A", "0.7", "B"]) == (["A", "B"], [0.3, 0.7])
    assert get_blend_from_list(["A", "B"]) == (["A", "B"], None)
    for bad in (["0.3", "A", "B"], ["0.3", "A", "B", "C"]):
        with pytest.raises(ValueError, match="--data-path"):
            get_blend_from_list(bad)
    with pytest.raises(ValueError, match="--split"):
        parse_and_normalize_split("1,x")


def corpus(path, first_token, n_docs=30):
    builder = IndexedDatasetBuilder(f"{path}.bin", dtype=np.uint16)
    for d in range(n_docs):
        builder.add_item([first_token] * 20 + [100])
        builder.end_document()
    builder.finalize(f"{path}.idx")
    return str(path)


def test_builder_blends_two_corpora_by_weight(tmp_path):
    a, b = corpus(tmp_path / "a", 1), corpus(tmp_path / "b", 2)
    cfg = GPTDatasetConfig(random_seed=3, sequence_length=8, blend=([a, b], [0.3, 0.7]), split="1",
                           path_to_cache=str(tmp_path / "cache"), tokenizer=NullTokenizer(100))
    train, valid, test = BlendedMegatronDatasetBuilder(GPTDataset, [200, 0, 0], lambda: True, cfg).build()
    assert isinstance(train, BlendedDataset) and valid is None and test is None
    assert len(train) == 60 + 140                                   # ceil(200*0.3) + ceil(200*0.7)
    source = [train[i]["dataset_id"] for i in range(len(train))]
    assert source.count(0) == 60 and source.count(1) == 140
    # dataset_id is honest: samples of A are made of A's tokens (1s and eods), B's of 2s.
    for i in range(0, 200, 17):
        tokens = set(train[i]["tokens"].tolist()) - {100}
        assert tokens == {1 + train[i]["dataset_id"]}
    # Each mid-level dataset was asked for its share plus the 0.5% surplus.
    assert [d.num_samples for d in train.datasets] == [61, 141]


def test_a_split_nobody_asks_for_is_empty(tmp_path):
    from types import SimpleNamespace
    from minitron.training.datasets.data_samplers import build_pretraining_data_loader
    a, b = corpus(tmp_path / "a", 1), corpus(tmp_path / "b", 2)
    cfg = GPTDatasetConfig(random_seed=3, sequence_length=8, blend=([a, b], [1, 1]), split="80,20,0",
                           tokenizer=NullTokenizer(100), path_to_cache=str(tmp_path / "cache"))
    train, valid, test = BlendedMegatronDatasetBuilder(GPTDataset, [10, 0, 0], lambda: True, cfg).build()
    # --eval-iters 0 asks for no validation sample: an empty blend (as in Megatron), no loader;
    # the test split has no share of the documents ("80,20,0"): no dataset at all.
    assert len(train) == 10 and len(valid) == 0 and test is None
    args = SimpleNamespace(micro_batch_size=2, dataloader_type="single", num_workers=0, seed=1234)
    assert build_pretraining_data_loader(valid, 0, args, 0, 1) is None
    batch = next(iter(build_pretraining_data_loader(train, 4, args, 0, 1)))
    assert list(batch["tokens"].shape) == [2, 8] and batch["dataset_id"].tolist() == [
        int(train.dataset_index[4]), int(train.dataset_index[5])]          # resumed at sample 4
