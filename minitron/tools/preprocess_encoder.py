"""The worker side of preprocess_data: one tokenizer per process, built once by the pool's
initializer, and the tokenizing of a block of lines (Megatron's ``Encoder`` in its
tools/preprocess_data.py). With one worker the reading process calls the same two functions.
"""

from __future__ import annotations

import json

import numpy as np

from minitron.training.tokenizer import make_tokenizer

_WORKER: dict = {}


def init_worker(spec: dict) -> None:
    _WORKER["tokenizer"] = make_tokenizer(**spec["tokenizer"])
    _WORKER["spec"] = spec


def encode_batch(batch: tuple[int, bytes]):
    """Tokenize a block of whole lines -> per key (tokens, lengths), bad lines, sizes.

    ``batch`` is (number of its first line, raw bytes ending in a newline): splitting lines
    here, not in the reading process, keeps the reader's work to one read and one count.
    """
    tokenizer, spec = _WORKER["tokenizer"], _WORKER["spec"]
    keys, append_eod, dtype = spec["json_keys"], spec["append_eod"], spec["dtype"]
    fast_bytes = hasattr(tokenizer, "tokenize_bytes")  # ByteLevelTokenizer: the UTF-8 bytes are the ids
    first_lineno, blob = batch
    out = {key: ([], []) for key in keys}
    bad, empty = [], 0  # empty: documents (line x key) with no token
    for lineno, line in enumerate(blob.split(b"\n"), start=first_lineno):
        if not line.strip():
            continue  # blank lines (a trailing newline, say) are not documents
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            bad.append((lineno, f"not valid JSON ({getattr(err, 'msg', None) or err})"))
            continue
        except RecursionError:  # json recurses per level: 10,000 [ would kill a worker
            bad.append((lineno, "JSON nested too deeply (a line is one object with string fields)"))
            continue
        texts = [record.get(key) if isinstance(record, dict) else None for key in keys]
        missing = [k for k, t in zip(keys, texts) if not isinstance(t, str)]
        if missing:
            bad.append((lineno, f"no string under key {missing[0]!r}"))
            continue
        docs = []
        try:
            for text in texts:
                if fast_bytes:
                    ids = np.frombuffer(tokenizer.tokenize_bytes(text), dtype=np.uint8).astype(dtype)
                else:
                    ids = in_vocabulary(tokenizer.tokenize(text), tokenizer).astype(dtype)
                if len(ids) and append_eod:
                    ids = np.append(ids, np.array(tokenizer.eod, dtype=dtype))
                docs.append(ids)
        except ValueError as err:  # e.g. NullTokenizer given words instead of ids
            bad.append((lineno, str(err)))
            continue
        # An empty text stays a document with no sequence (Megatron's preprocessing does the
        # same), so line n of the input is still document n of every key's index.
        empty += sum(len(d) == 0 for d in docs)
        for key, ids in zip(keys, docs):
            out[key][0].append(ids)
            out[key][1].append(len(ids))
    arrays = {key: (np.concatenate(t) if t else np.zeros(0, dtype), np.asarray(n, dtype=np.int64))
              for key, (t, n) in out.items()}
    return arrays, bad, empty, len(blob)


def in_vocabulary(ids: list, tokenizer) -> np.ndarray:
    """A tokenizer's ids, each checked to be an id of its vocabulary (NullTokenizer takes the
    numbers it reads as they are; 70000 would not fit the uint16 the .bin holds)."""
    vocab_size = tokenizer.vocab_size
    try:
        array = np.asarray(ids, dtype=np.int64)
    except OverflowError:
        array = np.asarray([vocab_size])  # beyond int64, so beyond the vocabulary too
    if len(array) and not (0 <= array.min() and array.max() < vocab_size):
        wrong = next(int(i) for i in ids if not 0 <= i < vocab_size)
        raise ValueError(f"token id {str(wrong)[:20]} is outside the vocabulary (ids 0..{vocab_size - 1}; "
                         f"{tokenizer.eod} is the end-of-document id)")
    return array
