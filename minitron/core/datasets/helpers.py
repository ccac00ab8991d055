"""The two index builders Megatron writes in C++ (helpers.cpp), here in numpy and Python.

build_sample_idx: where each training sample starts in the token stream.
build_blending_indices: which dataset each sample of a blend comes from.

The C++ builds the sample index with a loop over documents; the loop computes a closed form,
so numpy can compute it directly (see build_sample_idx). Blending is a greedy choice that
depends on every earlier choice; it stays a loop, in plain Python floats, which is fast enough
for millions of samples (scripts/bench_data.py measures both).
"""

from __future__ import annotations

import numpy as np


def build_sample_idx(sizes: np.ndarray, document_index: np.ndarray, seq_length: int,
                     num_epochs: int, tokens_per_epoch: int,
                     drop_last_partial_sequence: bool = True,
                     add_extra_token_to_sequence: int = 1) -> np.ndarray:
    """[num_samples + 1, 2] array: row k is (position in document_index, offset in that doc).

    Lay the documents end to end in ``document_index`` order: one stream of
    ``num_epochs * tokens_per_epoch`` tokens. Sample k reads tokens
    [k*seq_length, (k+1)*seq_length + extra): each sample shares its last (extra) token with
    the next one's first, because that token is a label of sample k and an input of k+1.
    So row k is just the stream position k*seq_length, written as (document, offset).

    Which document when a sample ends exactly on a boundary? Megatron's loop moves to the next
    document only while the sample still needs tokens, so the end position e = k*seq_length +
    extra belongs to the *first* document whose end is >= e: ``searchsorted(..., 'left')``.
    """
    assert seq_length > 1 and num_epochs > 0 and tokens_per_epoch > 1
    extra = int(add_extra_token_to_sequence)
    usable = num_epochs * tokens_per_epoch - extra
    num_samples = usable // seq_length if drop_last_partial_sequence else -(-usable // seq_length)
    doc_lengths = np.asarray(sizes)[document_index].astype(np.int64)
    doc_ends = np.cumsum(doc_lengths)                   # exclusive end of each document
    doc_starts = doc_ends - doc_lengths
    sample_starts = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    ends = sample_starts + extra                        # where sample k-1 stops (minus overlap)
    ends[0] = 0
    doc = np.searchsorted(doc_ends, ends, side="left")
    offset = sample_starts - doc_starts[np.minimum(doc, len(doc_ends) - 1)]
    # Row 0 is (0, 0) by definition. A partial last sample (drop_last False) may run past the
    # stream; Megatron pins it to the last document, at its length minus the overlap.
    doc[0], offset[0] = 0, 0
    past = doc >= len(doc_ends)
    doc[past] = len(doc_ends) - 1
    offset[past] = doc_lengths[-1] - extra
    dtype = np.int32 if max(len(document_index), int(doc_lengths.max(initial=0))) < 2**31 - 1 else np.int64
    return np.stack([doc, offset], axis=1).astype(dtype)


def build_blending_indices(weights, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset_index, dataset_sample_index), each of length ``size``.

    At step t every dataset i "should" have delivered weights[i] * t samples; it has delivered
    counts[i]. Give step t to the dataset furthest behind (largest weights[i]*t - counts[i]; the
    first one on a tie). The achieved ratios then track the weights at every prefix of the
    blend, not just at the end, so a run stopped early saw the intended mixture too.
    """
    weights = [float(w) for w in weights]
    counts = [0] * len(weights)
    dataset_index = np.zeros(size, dtype=np.int16)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    for t in range(size):
        target = max(float(t), 1.0)  # as Megatron: step 0 is scored as step 1
        best, best_error = 0, weights[0] * target - counts[0]
        for i in range(1, len(weights)):
            error = weights[i] * target - counts[i]
            if error > best_error:
                best, best_error = i, error
        dataset_index[t] = best
        dataset_sample_index[t] = counts[best]
        counts[best] += 1
    return dataset_index, dataset_sample_index


def build_exhaustive_blending_indices(sizes) -> tuple[np.ndarray, np.ndarray]:
    """Blend every sample of every dataset exactly once, interleaved in proportion to sizes.

    Same greedy rule as build_blending_indices, but a dataset leaves the race once all of its
    samples are spent, so the blend is the sum of the sizes long.
    """
    sizes = [int(s) for s in sizes]
    total = sum(sizes)
    weights = [s / total for s in sizes] if total else [0.0] * len(sizes)
    counts = [0] * len(sizes)
    unspent = [i for i, s in enumerate(sizes) if s > 0]
    dataset_index = np.zeros(total, dtype=np.int16)
    dataset_sample_index = np.zeros(total, dtype=np.int64)
    for t in range(total):
        target = max(float(t), 1.0)
        best = max(unspent, key=lambda i: (weights[i] * target - counts[i], -i))
        dataset_index[t] = best
        dataset_sample_index[t] = counts[best]
        counts[best] += 1
        if counts[best] == sizes[best]:
            unspent.remove(best)
    return dataset_index, dataset_sample_index
