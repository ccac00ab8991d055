"""BlendedMegatronDatasetBuilder: from (--data-path, --split, sample counts) to train/valid/test.

Three layers of dataset, as in Megatron:

    low level   IndexedDataset           the documents of one .bin/.idx (or mock documents)
    mid level   GPTDataset               one split of one low-level dataset, as samples
    top level   BlendedDataset           several mid-level datasets mixed by weight

build() must be called on every rank, because it contains barriers; it returns None for the
datasets of ranks that do not need them (``is_built_on_rank``: for GPT, tensor-parallel rank 0
of the first and last pipeline stages: the only ranks that read tokens or labels).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from minitron.core.datasets.blended_dataset import BlendedDataset
from minitron.core.datasets.utils import Split, normalize
from minitron.trace import traced


class BlendedMegatronDatasetBuilder:
    def __init__(self, cls, sizes, is_built_on_rank, config):
        """cls: the mid-level class (GPTDataset, MockGPTDataset); sizes: samples per split."""
        self.cls = cls
        self.sizes = list(sizes)
        self.is_built_on_rank = is_built_on_rank
        self.config = config

    @traced(args=lambda self: {"cls": self.cls.__name__, "sizes": self.sizes})
    def build(self) -> list:
        """[train, valid, test], each a dataset or None."""
        if self.config.mock:
            return self._build_megatron_dataset_splits(None, self.config.split_matrix, self.sizes)
        prefixes, weights = self.config.blend
        split = self.config.split_matrix
        if len(prefixes) == 1 and weights is None:  # one dataset, no weight: nothing to blend
            return self._build_megatron_dataset_splits(prefixes[0], split, self.sizes)
        # One dataset *with* a weight (``--data-path 1.0 A``) is blended all the same, as in
        # Megatron: its GPTDataset is built with the surplus, so it holds a few more samples
        # (and, past its first epoch, a different shuffle) than the unweighted ``A`` would.

        if weights is None:
            # No weights: each dataset contributes one epoch, the blend weighs them by size.
            sizes_per_dataset = [[None] * len(Split) for _ in prefixes]
        else:
            if any(size is None for size in self.sizes):
                raise ValueError("weighted --data-path blends need a sample count for every split")
            weights = normalize(weights)
            target = _get_size_per_split_per_dataset(weights, self.sizes)
            sizes_per_dataset = _get_size_per_split_per_dataset(
                weights, self.sizes, surplus=self.config.mid_level_dataset_surplus)
        megatron_datasets = self._build_megatron_datasets_all_prefixes(prefixes, split, sizes_per_dataset)

        blended = [None] * len(Split)
        for i in range(len(Split)):
            if split[i] is None:
                continue  # no such split (a weighted split of 0 samples is an empty blend)
            if weights is not None:
                weights_i = weights
                size_i = sum(per_dataset[i] for per_dataset in target)
            else:
                parts = megatron_datasets[i]
                weights_i = [len(d) for d in parts] if all(d is not None for d in parts) else [1] * len(parts)
                size_i = None if self.sizes[i] is None else min(self.sizes[i], sum(weights_i))
            blended[i] = self.build_generic_dataset(
                BlendedDataset, self.is_built_on_rank, True,
                megatron_datasets[i], weights_i, size_i, self.config)
        return blended

    def _build_megatron_datasets_all_prefixes(self, prefixes, split, sizes_per_dataset):
        """Mid-level datasets of every prefix: rank 0 first, one barrier, then the others."""
        datasets = [[] for _ in Split]

        def build_all():
            for prefix, sizes in zip(prefixes, sizes_per_dataset):
                for i, dataset in enumerate(self._build_megatron_dataset_splits(prefix, split, sizes, False)):
                    datasets[i].append(dataset)

        if torch.distributed.is_initialized():
            rank = torch.distributed.get_rank()
            if rank == 0:
                build_all()
            torch.distributed.barrier()  # the caches rank 0 wrote are now complete
            if rank != 0:
                build_all()
        else:
            build_all()
        return datasets

    @traced(args=lambda self, dataset_path, split, sizes, synchronize_ranks=True: {
        "dataset_path": dataset_path, "sizes": sizes, "built_here": self.is_built_on_rank()})
    def _build_megatron_dataset_splits(self, dataset_path, split, sizes, synchronize_ranks=True):
        """The mid-level dataset of each split of one low-level dataset (or None)."""
        if torch.distributed.is_initialized() and not self.is_built_on_rank():
            # Not needed here, but the barriers are collective: meet the builders at each one.
            for i in range(len(Split)):
                if split[i] is not None and synchronize_ranks:
                    torch.distributed.barrier()
            return [None] * len(Split)

        low_level_dataset = self.cls.build_low_level_dataset(dataset_path, self.config)
        num_elements = self.cls.numel_low_level_dataset(low_level_dataset)
        datasets = []
        for i, index_split in enumerate(Split):
            if split[i] is None:
                datasets.append(None)
                continue
            # The split owns documents [begin, end) of the low-level dataset, in file order.
            begin = int(round(split[i][0] * float(num_elements)))
            end = int(round(split[i][1] * float(num_elements)))
            indices = np.arange(begin, end, dtype=np.int32)
            datasets.append(self.build_generic_dataset(
                self.cls, self.is_built_on_rank, synchronize_ranks,
                low_level_dataset, dataset_path, indices, sizes[i], index_split, self.config))
        return datasets

    @staticmethod
    @traced(args=lambda cls, is_built_on_rank, synchronize_ranks, *args: {
        "cls": cls.__name__, "built_here": is_built_on_rank()})
    def build_generic_dataset(cls, is_built_on_rank, synchronize_ranks, *args):
        """Build ``cls(*args)`` on rank 0, then (after a barrier) on the other ranks that need it.

        Rank 0 finds the cache empty and builds and saves the indices. Every other rank is held
        at the barrier until then, so when it builds its own copy, it finds the saved files and
        maps them instead of computing them again. Ranks that need no dataset still enter the
        barrier: a barrier completes only when every rank of the group has entered it.
        """
        if not torch.distributed.is_initialized():
            return cls(*args)
        rank = torch.distributed.get_rank()
        dataset = None
        if rank == 0 and is_built_on_rank():
            try:
                dataset = cls(*args)
            except OSError as err:
                raise OSError(f"could not write the dataset index cache ({err}); pass a writable "
                              "directory with --data-cache-path") from err
        if synchronize_ranks:
            torch.distributed.barrier()
        if rank != 0 and is_built_on_rank():
            dataset = cls(*args)
        return dataset


def _get_size_per_split_per_dataset(weights, target_size_per_split, surplus: float = 0.0):
    """Samples to request from each dataset for each split: its share, rounded up, plus surplus."""
    return [[int(math.ceil(math.ceil((size or 0) * w) * (1 + surplus))) if size is not None else None
             for size in target_size_per_split] for w in weights]
