"""GPT-2's byte-level BPE, read from the usual vocab (JSON) and merges (text) files.

Three steps turn text into ids:

1. pre-tokenize: a regular expression cuts the text into words, numbers, punctuation runs and
   whitespace, each keeping its leading space (" world"); BPE never merges across these cuts;
2. bytes -> symbols: each UTF-8 byte becomes one printable character (bytes_to_unicode), so
   every string, in any script, is spelled with 256 base symbols and nothing is "unknown";
3. merge: repeatedly join the adjacent pair of symbols that ranks highest in merges.txt (the
   order the pairs were learned in), until no listed pair is left; look each result up in vocab.

Nothing here touches the network: the two files are the whole tokenizer.
"""

from __future__ import annotations

import json
import re
import unicodedata
from functools import lru_cache

# GPT-2's pre-tokenizer, as OpenAI's encoder.py and Megatron's gpt2_tokenization.py write it for
# the `regex` module, which knows Unicode classes: \p{L} letters, \p{N} numbers (any script).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@lru_cache(maxsize=1)
def _pattern():
    try:
        import regex  # an optional package: GPT-2's own choice where installed, else `re` below
        return regex.compile(GPT2_PATTERN)
    except ImportError:
        return re.compile(_stdlib_pattern())


@lru_cache(maxsize=1)
def _stdlib_pattern() -> str:
    r"""GPT2_PATTERN for the standard `re`, which has no \p{...}: spell the classes out.

    Letters and numbers become explicit character ranges built from unicodedata (categories
    L* and N*; "x²" is then "x" + "²", as GPT-2 cuts it). And `re`'s \s also matches the
    four separators \x1c-\x1f, which `regex` does not count as space, so they are taken out.
    The one difference left: characters newer than Python's Unicode database are neither.
    """

    def ranges(prefix: str) -> str:
        spans, start, prev = [], None, None
        for cp in range(0x40000):  # Unicode places every letter and number in planes 0-3
            if unicodedata.category(chr(cp))[0] == prefix:
                if start is None:
                    start = cp
                prev = cp
            elif start is not None:
                spans.append((start, prev))
                start = None
        if start is not None:
            spans.append((start, prev))
        return "".join(re.escape(chr(a)) + ("-" + re.escape(chr(b)) if b > a else "") for a, b in spans)

    letters, numbers = ranges("L"), ranges("N")
    space, not_space = r"[^\S\x1c-\x1f]", r"(?:\S|[\x1c-\x1f])"
    other = rf"(?:[^\s{letters}{numbers}]|[\x1c-\x1f])"
    return (rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[{letters}]+| ?[{numbers}]+| ?{other}+"""
            rf"""|{space}+(?!{not_space})|{space}+""")


ENDOFTEXT = "<|endoftext|>"


@lru_cache()
def bytes_to_unicode() -> dict[int, str]:
    """Byte value -> a printable character standing for it.

    Printable Latin-1 bytes stand for themselves; the rest (controls, space, ...) are moved to
    code points from 256 up, so no symbol is whitespace or invisible (a space becomes "Ġ").
    """
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    mapping, moved = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + moved)
            moved += 1
    return mapping


def pretokenize(text: str) -> list[str]:
    return _pattern().findall(text)


def get_pairs(word: tuple[str, ...]) -> set[tuple[str, str]]:
    return {(a, b) for a, b in zip(word[:-1], word[1:])}



def merge_pair(word, first: str, second: str) -> list[str]:
    """``word`` (a sequence of symbols) with every adjacent (first, second) joined, left to right."""
    merged, i = [], 0
    while i < len(word):
        if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
            merged.append(first + second)
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return merged

class GPT2Tokenizer:
    def __init__(self, vocab_file: str, merges_file: str):
        try:
            with open(vocab_file, encoding="utf-8") as f:
                self.encoder: dict[str, int] = json.load(f)
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"--vocab-file {vocab_file}: cannot read a JSON vocabulary ({err})") from None
        except UnicodeDecodeError as err:
            raise ValueError(f"--vocab-file {vocab_file}: not UTF-8 text (byte {err.start})") from None
        try:
            with open(merges_file, encoding="utf-8") as f:
                lines = [line.rstrip("\n") for line in f]
        except OSError as err:
            raise ValueError(f"--merge-file {merges_file}: {err.strerror}") from None
        except UnicodeDecodeError as err:
            raise ValueError(f"--merge-file {merges_file}: not UTF-8 text (byte {err.start})") from None
        merges = [tuple(line.split()) for line in lines if line and not line.startswith("#version")]
        bad = next((m for m in merges if len(m) != 2), None)
        if bad is not None:
            raise ValueError(f"--merge-file {merges_file}: each line must hold two symbols, got {' '.join(bad)!r}")
        self.bpe_ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.decoder = {i: s for s, i in self.encoder.items()}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        missing = [c for c in self.byte_encoder.values() if c not in self.encoder]
        if missing:
            raise ValueError(f"--vocab-file {vocab_file}: lacks {len(missing)} of the 256 byte "
                             "symbols; it is not a byte-level BPE vocabulary")
        self._cache: dict[str, list[int]] = {}

    def bpe(self, token: str) -> tuple[str, ...]:
        """Merge the symbols of one pre-token, best-ranked pair first, until none applies."""
        word = tuple(token)
        while len(word) > 1:
            pair = min(get_pairs(word), key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if pair not in self.bpe_ranks:
                break
            word = tuple(merge_pair(word, *pair))
        return word

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        cache = self._cache
        for piece in pretokenize(text):
            cached = cache.get(piece)
            if cached is None:
                symbols = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
                cached = [self.encoder[s] for s in self.bpe(symbols)]
                if len(cache) < 200_000:  # words repeat (Zipf): a bounded cache does most of the work
                    cache[piece] = cached
            ids.extend(cached)
        return ids

    def decode(self, ids) -> str:
        text = "".join(self.decoder[int(i)] for i in ids)
        return bytearray(self.byte_decoder[c] for c in text).decode("utf-8", errors="replace")
