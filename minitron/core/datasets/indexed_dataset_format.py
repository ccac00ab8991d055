"""The writing half of the indexed dataset, without torch: token types, the .idx writer, the builder.

Megatron keeps all of this in ``megatron/core/datasets/indexed_dataset.py``, beside the reader;
so does minitron as far as a reader can tell: every name here is imported there too, and
``from minitron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder`` works as in
Megatron. It lives in a file of its own because that file's reader is a ``torch`` Dataset, and
``minitron preprocess`` needs only numpy: importing torch there cost ~2 s per run, and a bad
corpus was refused only after it. The byte layout these functions write is drawn in
indexed_dataset.py's docstring.
"""

from __future__ import annotations

import struct
from enum import Enum

import numpy as np

_INDEX_HEADER = b"MMIDIDX\x00\x00"
_VERSION = 1
_HEADER_BYTES = 9 + 8 + 1 + 8 + 8  # = 34: magic, version, dtype code, N, D


class IndexedDatasetError(ValueError):
    """A .bin/.idx pair that cannot be read; the message says which file and why."""


class DType(Enum):
    """The code stored in byte 17 of the .idx for each token type."""

    uint8 = 1
    int8 = 2
    int16 = 3
    int32 = 4
    int64 = 5
    float64 = 6
    float32 = 7
    uint16 = 8

    @classmethod
    def code_from_dtype(cls, dtype) -> int:
        return cls[np.dtype(dtype).name].value

    @classmethod
    def dtype_from_code(cls, code: int) -> np.dtype:
        return np.dtype(cls(code).name)

    @staticmethod
    def optimal_dtype(vocab_size: int | None):
        """uint16 while every id fits (half the disk and page cache of int32), else int32.

        Megatron's threshold is 65500, a little under 2**16, and so is ours."""
        return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def get_idx_path(path_prefix: str) -> str:
    return path_prefix + ".idx"


def get_bin_path(path_prefix: str) -> str:
    return path_prefix + ".bin"


def write_index(idx_path: str, dtype, sequence_lengths, document_indices) -> None:
    """Write a .idx file: the header, then lengths, pointers and document indices."""
    lengths = np.asarray(sequence_lengths, dtype=np.int32)
    itemsize = np.dtype(dtype).itemsize
    # Each sequence starts where the previous one ended: an exclusive running sum, in bytes.
    pointers = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
    pointers *= itemsize
    documents = np.asarray(document_indices, dtype=np.int64)
    with open(idx_path, "wb") as f:
        f.write(_INDEX_HEADER)
        f.write(struct.pack("<Q", _VERSION))
        f.write(struct.pack("<B", DType.code_from_dtype(dtype)))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(documents)))
        f.write(lengths.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(documents.tobytes(order="C"))


class IndexedDatasetBuilder:
    """Append documents to a .bin as they come; ``finalize`` writes the .idx from what was seen.

    Only the lengths are kept in memory (4 bytes per sequence), never the tokens. The methods
    are Megatron's, with its signatures; ``add_flat_documents`` is ours (preprocess's fast path).
    """

    def __init__(self, bin_path: str, dtype=np.int32, multimodal: bool = False):
        if multimodal:
            raise ValueError("IndexedDatasetBuilder(multimodal=True): minitron writes GPT (text-only) "
                             "indices, without Megatron's per-sequence modes")
        self.dtype = np.dtype(dtype)
        self.multimodal = False
        self.data_file = open(bin_path, "wb")
        self.sequence_lengths: list[int] = []
        self.document_indices: list[int] = [0]

    def add_item(self, tokens) -> None:
        """One sequence (a sentence, or a whole document when sentences are not split)."""
        array = np.asarray(tokens, dtype=self.dtype)
        self.data_file.write(array.tobytes(order="C"))
        self.sequence_lengths.append(array.size)

    def end_document(self) -> None:
        self.document_indices.append(len(self.sequence_lengths))

    def add_document(self, tokens, lengths, modes=None) -> None:
        """A document whose tokens are ``lengths`` sequences back to back.

        ``lengths`` may be empty: a document with no sequence (an empty text). It still ends a
        document, so document d of the input stays document d of the index, as in Megatron.
        ``modes`` is accepted for Megatron's signature and unused, as in its text-only builder.
        """
        array = np.asarray(tokens, dtype=self.dtype)
        self.data_file.write(array.tobytes(order="C"))
        self.sequence_lengths.extend(int(n) for n in lengths)
        self.end_document()

    def add_documents(self, documents, modes=None, eod_token: int | None = None,
                      chunk_size: int = 1_000_000) -> None:
        """Many documents, each one sequence: ``documents`` is a list of token arrays (Megatron
        takes an awkward jagged array; anything that slices and iterates as arrays will do).
        With ``eod_token``, every document gets it appended. ``modes`` is unused (text only)."""
        for start in range(0, len(documents), chunk_size):
            arrays = [np.asarray(d, dtype=self.dtype).reshape(-1) for d in documents[start:start + chunk_size]]
            if eod_token is not None:
                arrays = [np.append(a, np.array(eod_token, dtype=self.dtype)) for a in arrays]
            for array in arrays:
                self.data_file.write(array.tobytes(order="C"))
            first = len(self.sequence_lengths)
            self.sequence_lengths.extend(a.size for a in arrays)
            self.document_indices.extend(range(first + 1, first + len(arrays) + 1))

    def add_flat_documents(self, tokens, lengths) -> None:
        """Many documents whose tokens come back to back in one flat array, ``lengths[d]``
        tokens each. A document of length 0 gets no sequence at all, as Megatron's
        preprocessing writes an empty text: add_document([], [])."""
        self.data_file.write(np.asarray(tokens, dtype=self.dtype).tobytes(order="C"))
        lengths = np.asarray(lengths, dtype=np.int64)
        first = len(self.sequence_lengths)
        self.sequence_lengths.extend(lengths[lengths > 0].tolist())
        self.document_indices.extend((first + np.cumsum(lengths > 0)).tolist())

    def finalize(self, idx_path: str) -> None:
        self.data_file.close()
        write_index(idx_path, self.dtype, self.sequence_lengths, self.document_indices)
