"""The .bin/.idx pair: written bytes match the documented layout, read back equal, fail clearly."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from minitron.core.datasets.indexed_dataset import (
    DType, IndexedDataset, IndexedDatasetBuilder, IndexedDatasetError,
)

DOCS = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]


def write(prefix, docs=DOCS, dtype=np.uint16):
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in docs:
        builder.add_item(doc)
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


def test_idx_bytes_follow_the_documented_layout(tmp_path):
    prefix = write(tmp_path / "d")
    raw = open(f"{prefix}.idx", "rb").read()
    n, d = len(DOCS), len(DOCS) + 1
    assert raw[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack("<Q", raw[9:17]) == (1,)                      # version
    assert raw[17] == DType.uint16.value == 8                           # dtype code
    assert struct.unpack("<QQ", raw[18:34]) == (n, d)                   # N, D
    lengths = np.frombuffer(raw, np.int32, n, 34)
    pointers = np.frombuffer(raw, np.int64, n, 34 + 4 * n)
    documents = np.frombuffer(raw, np.int64, d, 34 + 12 * n)
    assert lengths.tolist() == [3, 1, 5, 2]
    assert pointers.tolist() == [0, 6, 8, 18]                           # bytes: 2 per uint16 token
    assert documents.tolist() == [0, 1, 2, 3, 4]
    assert len(raw) == 34 + 4 * n + 8 * n + 8 * d
    # The .bin is the tokens back to back, nothing else.
    assert np.fromfile(f"{prefix}.bin", np.uint16).tolist() == sum(DOCS, [])


def test_round_trip_and_partial_reads(tmp_path):
    ds = IndexedDataset(write(tmp_path / "d", dtype=np.int32))
    assert len(ds) == 4 and ds.dtype == np.int32
    assert [ds[i].tolist() for i in range(4)] == DOCS
    assert ds.get(2, offset=1, length=3).tolist() == [10, 11, 12]
    assert ds.get(2, offset=3).tolist() == [12, 13]
    # Bulk appends (what preprocessing uses) write exactly the same files.
    bulk = IndexedDatasetBuilder(str(tmp_path / "b.bin"), dtype=np.int32)
    bulk.add_flat_documents(np.concatenate(DOCS), [len(d) for d in DOCS])
    bulk.finalize(str(tmp_path / "b.idx"))
    for ext in ("bin", "idx"):
        assert (tmp_path / f"b.{ext}").read_bytes() == (tmp_path / f"d.{ext}").read_bytes()


def test_optimal_dtype_switches_at_megatrons_threshold():
    assert DType.optimal_dtype(50257) == np.uint16
    assert DType.optimal_dtype(65500) == np.int32


def test_truncated_bin_is_reported(tmp_path):
    prefix = write(tmp_path / "d")
    data = open(f"{prefix}.bin", "rb").read()
    open(f"{prefix}.bin", "wb").write(data[:-4])
    with pytest.raises(IndexedDatasetError, match=r"d\.bin is 18 bytes but .* describes 22 bytes"):
        IndexedDataset(prefix)


def test_wrong_magic_and_truncated_idx_are_reported(tmp_path):
    prefix = write(tmp_path / "d")
    raw = bytearray(open(f"{prefix}.idx", "rb").read())
    open(f"{prefix}.idx", "wb").write(raw[:-8])
    with pytest.raises(IndexedDatasetError, match="truncated or corrupt"):
        IndexedDataset(prefix)
    raw[:3] = b"XYZ"
    open(f"{prefix}.idx", "wb").write(raw)
    with pytest.raises(IndexedDatasetError, match="is not an indexed-dataset index"):
        IndexedDataset(prefix)


def test_missing_files_name_the_prefix_convention(tmp_path):
    with pytest.raises(IndexedDatasetError, match="--data-path takes the prefix"):
        IndexedDataset(str(tmp_path / "nothing"))
