r"""The indexed dataset: every document's tokens back to back in a .bin, their boundaries in a .idx.

A training run reads tokens at random places of a corpus far larger than memory. The pair of
files makes that cheap: the .bin is one flat array of token ids (no separators, no framing), and
the .idx says where each sequence starts and how long it is. Both are memory-mapped, so opening
a 100 GB corpus costs a few page faults, and reading a sample costs one slice.

The byte layout is Megatron's (``megatron/core/datasets/indexed_dataset.py``), so files written
here open there and the other way round. All integers are little-endian.

--8<-- [start:idx-layout]
    offset        size   field
    0             9      magic: the bytes  M M I D I D X \x00 \x00
    9             8      version: uint64, always 1
    17            1      dtype code: uint8 (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
                         6 float64, 7 float32, 8 uint16) -- the type of every token in .bin
    18            8      sequence count N: uint64
    26            8      document count D: uint64, which is the number of documents + 1
    34            4 N    sequence lengths: int32[N], in tokens
    34 + 4N       8 N    sequence pointers: int64[N], byte offset of each sequence in .bin
    34 + 12N      8 D    document indices: int64[D]; document d is sequences
                         [doc[d], doc[d+1]), so doc[0] = 0 and doc[D-1] = N
--8<-- [end:idx-layout]

Without sentence splitting (the GPT case) every document is one sequence, so N = D - 1 and the
document indices are simply 0, 1, ..., N. The pointers are redundant with the lengths (a running
sum times the item size); Megatron stores them so a reader never has to compute the sum.

This file is the reader. The writer's half (DType, write_index, IndexedDatasetBuilder) is in
indexed_dataset_format.py, imported here, so every name of Megatron's file is found in this one:
this module imports torch (IndexedDataset is a torch Dataset, as Megatron's is), and
``minitron preprocess``, which only writes, should not pay ~2 s for it.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import torch

# The writer's half, torch-free; imported by name so Megatron's imports from this module work.
from minitron.core.datasets.indexed_dataset_format import (  # noqa: F401
    _HEADER_BYTES, _INDEX_HEADER, _VERSION, DType, IndexedDatasetBuilder, IndexedDatasetError,
    get_bin_path, get_idx_path, write_index,
)


class _IndexReader:
    """The .idx, memory-mapped; every field is checked against the file's size before use."""

    def __init__(self, idx_path: str):
        try:
            size = os.path.getsize(idx_path)
            with open(idx_path, "rb") as f:
                header = f.read(_HEADER_BYTES)
        except OSError as err:
            raise IndexedDatasetError(f"cannot read {idx_path}: {err.strerror}") from None
        if len(header) < _HEADER_BYTES or header[:9] != _INDEX_HEADER:
            raise IndexedDatasetError(
                f"{idx_path} is not an indexed-dataset index (it should start with the bytes "
                f"{_INDEX_HEADER!r}); regenerate it with `minitron preprocess`")
        version, code, n, d = struct.unpack("<QBQQ", header[9:])
        if version != _VERSION:
            raise IndexedDatasetError(f"{idx_path} has index version {version}; only {_VERSION} is known")
        try:
            self.dtype = DType.dtype_from_code(code)
        except ValueError:
            raise IndexedDatasetError(f"{idx_path} names token type code {code}, which is not one of 1-8") from None
        expected = _HEADER_BYTES + 4 * n + 8 * n + 8 * d
        # Megatron's multimodal variant appends one int8 "mode" per sequence; we read past it.
        if size not in (expected, expected + n):
            raise IndexedDatasetError(
                f"{idx_path} is {size} bytes but its header ({n} sequences, {d} document "
                f"indices) needs {expected}: the file is truncated or corrupt; regenerate it")
        self.sequence_count, self.document_count = n, d
        buffer = np.memmap(idx_path, mode="r", dtype=np.uint8) if size else np.zeros(0, np.uint8)
        self.sequence_lengths = np.frombuffer(buffer, np.int32, count=n, offset=_HEADER_BYTES)
        self.sequence_pointers = np.frombuffer(buffer, np.int64, count=n, offset=_HEADER_BYTES + 4 * n)
        self.document_indices = np.frombuffer(buffer, np.int64, count=d, offset=_HEADER_BYTES + 12 * n)
        if d == 0 or self.document_indices[0] != 0 or self.document_indices[-1] != n:
            raise IndexedDatasetError(
                f"{idx_path}: document indices must run from 0 to the sequence count {n}; "
                "the index is corrupt, regenerate it")


class IndexedDataset(torch.utils.data.Dataset):
    """Read-only view of PREFIX.bin + PREFIX.idx. ``ds[i]`` is sequence i as a numpy array."""

    def __init__(self, path_prefix: str):
        super().__init__()
        self._open(path_prefix)

    def _open(self, path_prefix: str) -> None:
        self.path_prefix = path_prefix
        bin_path, idx_path = get_bin_path(path_prefix), get_idx_path(path_prefix)
        missing = [p for p in (idx_path, bin_path) if not os.path.isfile(p)]
        if missing:
            raise IndexedDatasetError(
                f"{' and '.join(missing)} not found: --data-path takes the prefix of a .bin/.idx "
                "pair written by `minitron preprocess` (e.g. data/corpus_text_document)")
        self.index = _IndexReader(idx_path)
        itemsize = self.index.dtype.itemsize
        n = self.index.sequence_count
        needed = int(self.index.sequence_pointers[-1] + self.index.sequence_lengths[-1] * itemsize) if n else 0
        have = os.path.getsize(bin_path)
        if have != needed:
            raise IndexedDatasetError(
                f"{bin_path} is {have} bytes but {idx_path} describes {needed} bytes of tokens: "
                "the pair does not match (truncated or overwritten .bin?); regenerate both")
        self._bin = np.memmap(bin_path, mode="r", dtype=self.index.dtype) if have else np.zeros(0, self.index.dtype)

    # A DataLoader worker receives the dataset pickled: send the prefix, not the mapped arrays.
    def __getstate__(self):
        return self.path_prefix

    def __setstate__(self, state):
        self._open(state)

    def __len__(self) -> int:
        return self.index.sequence_count

    def __getitem__(self, idx):
        """``ds[i]``: sequence i. ``ds[a:b]``: a list of sequences a..b-1, read in one slice of
        the .bin (they lie back to back). As in Megatron, only step-1 slices are allowed."""
        if isinstance(idx, (int, np.integer)):
            return self.get(idx)
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError(f"IndexedDataset slices must be contiguous (step 1), got step {step}")
            lengths = self.index.sequence_lengths[start:stop]
            # Megatron's edge cases, kept: an empty slice inside the dataset gives [one empty
            # array], one starting at len(ds) raises IndexError (there is no pointer there).
            first = int(self.index.sequence_pointers[start]) // self.index.dtype.itemsize
            tokens = self._bin[first:first + int(lengths.sum())]
            return np.split(tokens, np.cumsum(lengths)[:-1])
        raise TypeError(f"IndexedDataset index must be an int or a slice, not {type(idx).__name__}")

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens [offset, offset + length) of sequence ``idx`` (to its end if length is None)."""
        start = int(self.index.sequence_pointers[idx]) // self.index.dtype.itemsize + offset
        if length is None:
            length = int(self.index.sequence_lengths[idx]) - offset
        return self._bin[start:start + length]

    @property
    def sequence_lengths(self) -> np.ndarray:
        return self.index.sequence_lengths

    @property
    def document_indices(self) -> np.ndarray:
        return self.index.document_indices

    @property
    def dtype(self) -> np.dtype:
        return self.index.dtype

    @staticmethod
    def exists(path_prefix: str) -> bool:
        return os.path.isfile(get_idx_path(path_prefix)) and os.path.isfile(get_bin_path(path_prefix))
