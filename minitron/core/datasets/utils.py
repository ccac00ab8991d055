"""Small pieces every dataset shares: the split enum, weights, the blend list, the index cache.

The cache is the part worth reading. Building a GPTDataset's indices for a large corpus takes
seconds to minutes; every rank that needs the dataset would otherwise build the same arrays.
So one rank builds them and saves them as ``.npy`` files named by a hash of everything that
determines them; the others wait at a barrier and then map the files (see
blended_megatron_dataset_builder.build_generic_dataset for the barrier).
"""

from __future__ import annotations

import os
from enum import Enum

import numpy as np


class Split(Enum):
    train = 0
    valid = 1
    test = 2


def normalize(weights) -> list[float]:
    """Scale non-negative weights to sum to 1 (no softmax: the ratios are the user's)."""
    w = np.asarray(weights, dtype=np.float64)
    return (w / w.sum()).tolist()


def get_blend_from_list(blend: list[str] | None):
    """``--data-path`` as given -> (prefixes, weights or None).

    Two spellings, as in Megatron: ``A B C`` (weights follow from the datasets' sizes) or
    ``0.3 A 0.7 B`` (weight, prefix pairs). Raises ValueError with one line when it is neither.
    """
    if not blend:
        return None
    if len(blend) % 2 == 1 or not _is_number(blend[0]):
        if any(_is_number(item) for item in blend):
            raise ValueError(
                f"--data-path {' '.join(blend)}: mixes numbers and prefixes; give either "
                "PREFIX [PREFIX ...] or WEIGHT PREFIX [WEIGHT PREFIX ...]")
        return [p.strip() for p in blend], None
    weights, prefixes = blend[0::2], blend[1::2]
    bad = [w for w in weights if not _is_number(w)] + [p for p in prefixes if _is_number(p)]
    if bad:
        raise ValueError(f"--data-path expects WEIGHT PREFIX pairs; {bad[0]!r} is out of place")
    weights = [float(w) for w in weights]
    if any(not 0 < w < float("inf") for w in weights):
        # Megatron's BlendedDataset refuses a weight of 0 too (it asserts every weight > 0).
        raise ValueError(f"--data-path weights {weights} must all be positive and finite; "
                         "leave a dataset out rather than give it weight 0")
    return [p.strip() for p in prefixes], weights


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def is_rank_0() -> bool:
    import torch  # lazy: the command line parses --data-path with this module, before (or without) torch
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def log_single_rank(message: str) -> None:
    """Print once per job, not once per rank: the builders run on many ranks."""
    if is_rank_0():
        print(message, flush=True)


def build_or_load_indices(path_to_cache: str | None, base: str, description: str,
                          names: tuple[str, ...], build):
    """Return ``({name: array}, built_here)`` for the index arrays called ``names``.

    * no cache directory: build (every rank that asks builds its own copy; mock data does this);
    * cache hit: map the saved ``.npy`` files read-only;
    * cache miss on rank 0: build, then save. The description file is written last, and a hit
      needs it, so a build interrupted half-way is a miss, never a half-read cache;
    * cache miss on another rank: an error. The barrier in build_generic_dataset makes every
      other rank wait until rank 0 has saved, so reaching here means that protocol was broken.
    """
    if not path_to_cache:
        return build(), True
    paths = {name: os.path.join(path_to_cache, f"{base}-{name}.npy") for name in names}
    path_to_description = os.path.join(path_to_cache, f"{base}-description.txt")
    cache_hit = all(os.path.isfile(p) for p in [path_to_description, *paths.values()])
    if not cache_hit and is_rank_0():
        arrays = build()
        os.makedirs(path_to_cache, exist_ok=True)
        for name, path in paths.items():
            tmp = f"{path}.tmp{os.getpid()}.npy"
            np.save(tmp, arrays[name])
            os.replace(tmp, path)  # atomic: a reader sees the old file or the whole new one
        tmp = f"{path_to_description}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(description)
        os.replace(tmp, path_to_description)
        return arrays, True
    if not cache_hit:
        import torch  # lazy, as in is_rank_0
        raise RuntimeError(
            f"rank {torch.distributed.get_rank()} found no cached indices {base}-* in "
            f"{path_to_cache}: rank 0 builds them before the barrier; is --data-cache-path a "
            "directory every rank sees (shared, not node-local)?")
    return {name: np.load(path, mmap_mode="r") for name, path in paths.items()}, False
