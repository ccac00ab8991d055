"""What a dataset build needs to know, in one object: the blend, the split, the seed, the cache.

``--split 969,30,1`` becomes a *split matrix*: for train, valid and test, the fraction of each
dataset's documents [begin, end) that the split owns. The same matrix is applied to every
dataset of a blend, so train/valid/test never share a document.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from minitron.core.datasets.utils import Split, normalize


@dataclass
class BlendedMegatronDatasetConfig:
    random_seed: int
    """Seeds every shuffle of the document, shuffle and blending indices."""

    sequence_length: int

    blend: tuple[list[str], list[float] | None] | None = None
    """(prefixes, weights or None), from get_blend_from_list(--data-path). None means mock data."""

    split: str | None = None
    """'969,30,1': relative sizes of train, valid, test (any scale; normalised)."""

    split_matrix: list | None = field(init=False, default=None)
    """Derived from split: [(begin, end) or None] per Split."""

    path_to_cache: str | None = None
    """Where the index .npy files go (--data-cache-path); see utils.build_or_load_indices."""

    mock: bool = field(init=False, default=False)
    """True when there is no blend: synthetic tokens, nothing read from disk."""

    tokenizer: object = None
    """Needed for its eod (and pad) ids."""

    mid_level_dataset_surplus: float = 0.005
    """Build each blended dataset this fraction larger than its share, so the greedy blend,
    which can run a sample or two ahead of a dataset's exact share, never runs out."""

    def __post_init__(self):
        if self.blend is None:
            self.mock = True
            self.split = self.split or "1,1,1"  # any split will do for synthetic data
        elif self.split is None:
            raise ValueError("a --data-path blend needs --split (e.g. 969,30,1)")
        elif self.blend[1] is not None and len(self.blend[0]) != len(self.blend[1]):
            raise ValueError("--data-path: the number of weights and prefixes differ")
        self.split_matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(self.split))


def parse_and_normalize_split(split: str) -> list[float]:
    """'969,30,1' -> [0.969, 0.030, 0.001]; missing trailing parts count as 0."""
    # Quotes are skipped as separators are: Megatron picks the numbers out of the string, so a
    # shell's quotes left inside the value (its llama3 and gpt-oss examples pass '99,1,0') parse.
    parts = re.findall(r"[^,\s/'\"]+", split)
    try:
        vector = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"--split {split!r}: expected up to 3 numbers like 969,30,1") from None
    if not 1 <= len(vector) <= len(Split) or any(v < 0 for v in vector) or sum(vector) <= 0:
        raise ValueError(f"--split {split!r}: expected 1 to 3 non-negative numbers, not all zero")
    return normalize(vector + [0.0] * (len(Split) - len(vector)))


def convert_split_vector_to_split_matrix(vector: list[float]) -> list[tuple[float, float] | None]:
    """[0.969, 0.03, 0.001] -> [(0, 0.969), (0.969, 0.999), (0.999, 1.0)]; an empty share -> None."""
    bounds = functools.reduce(lambda acc, x: acc + [acc[-1] + x], vector, [0.0])
    return [(lo, hi) if hi > lo else None for lo, hi in zip(bounds[:-1], bounds[1:])]
