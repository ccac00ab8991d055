"""BlendedDataset: ``--data-path 0.3 A 0.7 B`` as one dataset whose samples come 30/70 from A/B.

Two index arrays, cached like GPTDataset's: ``dataset_index[i]`` says which dataset sample i
comes from, ``dataset_sample_index[i]`` which of that dataset's samples it is. Each dataset's
samples are taken in order 0, 1, 2, ...; they are already shuffled inside the GPTDataset, so
the blend needs no shuffle of its own.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict

import numpy as np
import torch

from minitron.core.datasets.helpers import build_blending_indices, build_exhaustive_blending_indices
from minitron.core.datasets.utils import build_or_load_indices, log_single_rank, normalize
from minitron.trace import traced


class BlendedDataset(torch.utils.data.Dataset):
    def __init__(self, datasets, weights, size: int | None, config):
        if len(datasets) != len(weights):
            raise ValueError("BlendedDataset: one weight per dataset")
        if not all(w > 0 for w in weights):
            raise ValueError(f"BlendedDataset: every weight must be positive, got {list(weights)}")
        self.datasets = datasets
        self.weights = normalize(weights)
        self.size = size
        self.config = config

        identifiers = OrderedDict()
        identifiers["class"] = type(self).__name__
        identifiers["datasets"] = [d.unique_identifiers for d in datasets]
        identifiers["weights"] = self.weights
        identifiers["size"] = size
        self.unique_identifiers = identifiers
        self.unique_description = json.dumps(identifiers, indent=4)
        self.unique_description_hash = hashlib.md5(self.unique_description.encode("utf-8")).hexdigest()
        self.built_anew_on_cache_miss = False
        self.dataset_index, self.dataset_sample_index = self._build_indices()
        if self.size is None:
            self.size = len(self.dataset_index)
        # Every index must be within its dataset: the surplus should have guaranteed it.
        for i, dataset in enumerate(datasets):
            picked = self.dataset_sample_index[self.dataset_index == i]
            if len(picked) and picked.max() >= len(dataset):
                raise RuntimeError(f"the blend takes {picked.max() + 1} samples from dataset {i}, "
                                   f"which has {len(dataset)}; raise mid_level_dataset_surplus")

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> dict:
        dataset_id = int(self.dataset_index[idx])
        sample = self.datasets[dataset_id][int(self.dataset_sample_index[idx])]
        return {"dataset_id": dataset_id, **sample}

    @traced(args=lambda self: {"datasets": len(self.datasets), "size": self.size})
    def _build_indices(self):
        def build():
            if self.size is None:  # every sample of every dataset, once
                di, dsi = build_exhaustive_blending_indices([len(d) for d in self.datasets])
            else:
                di, dsi = build_blending_indices(self.weights, self.size)
            return {"dataset_index": di, "dataset_sample_index": dsi}

        arrays, self.built_anew_on_cache_miss = build_or_load_indices(
            self.config.path_to_cache, f"{self.unique_description_hash}-{type(self).__name__}",
            self.unique_description, ("dataset_index", "dataset_sample_index"), build)
        counts = np.bincount(arrays["dataset_index"], minlength=len(self.datasets))
        achieved = ", ".join(f"{c / max(len(arrays['dataset_index']), 1):.3f}" for c in counts)
        log_single_rank(f"> {type(self).__name__}: {len(arrays['dataset_index'])} samples, "
                        f"weights {[round(w, 3) for w in self.weights]}, achieved [{achieved}]")
        return arrays["dataset_index"], arrays["dataset_sample_index"]
