"""--tokenizer-type TikTokenizer: a byte-level BPE in tiktoken's vocabulary JSON (--tokenizer-model),
read by the `tiktoken` package, as Megatron 0.19.2's TikTokenTokenizer defines it.

The file is a list of ``{"rank": i, "token_bytes": base64, "token_str": ...}`` whose first 256
entries are the single bytes (so any text can be spelled). Megatron puts
--tiktoken-num-special-tokens ids (default 1000) in front: ``<unk> <s> </s> <mask> <pad> <cls>
<sep>``, then ``<SPECIAL_7>`` ... as filler; each BPE rank r becomes id r + that number. The
vocabulary is --vocab-size ids in all (Megatron's default 2**17), so the file is cut to its first
vocab_size - num_special ranks. End-of-document is ``</s>``, id 2. Text is split by the v1 or v2
pattern (--tiktoken-pattern; v2 unless given) before the merges.
"""

from __future__ import annotations

import base64
import json
import os

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>")
DEFAULT_VOCAB_SIZE = 2 ** 17
PATTERNS = {
    "v1": r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    "v2": (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
           r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
           r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
}


def _mergeable_ranks(path: str, keep: int, shift: int) -> dict[bytes, int]:
    """The file's first ``keep`` ranks, as bytes -> id (rank + ``shift``); each entry checked."""
    with open(path) as f:
        vocab = json.load(f)
    if not isinstance(vocab, list) or len(vocab) < min(keep, 256):
        raise ValueError(f"--tokenizer-model {path}: a tiktoken vocabulary is a JSON list of at least the "
                         "256 single bytes")
    ranks = {}
    for i, entry in enumerate(vocab[:keep]):
        if not isinstance(entry, dict) or entry.get("rank") != i or "token_bytes" not in entry:
            raise ValueError(f"--tokenizer-model {path}: entry {i} is not {{'rank': {i}, 'token_bytes': ...}}")
        token = base64.b64decode(entry["token_bytes"])
        if i < 256 and token != bytes([i]):
            raise ValueError(f"--tokenizer-model {path}: rank {i} must be the single byte {i}")
        ranks[token] = i + shift
    if len(ranks) != keep:
        raise ValueError(f"--tokenizer-model {path}: {len(ranks)} distinct ranks, --vocab-size needs {keep}")
    return ranks


class TikTokenizer:
    def __init__(self, tokenizer_model: str | None, vocab_size: int | None = None, pattern: str | None = None,
                 num_special_tokens: int = 1000):
        if not tokenizer_model:
            raise ValueError("--tokenizer-type TikTokenizer needs --tokenizer-model PATH (tiktoken's vocabulary JSON)")
        try:
            import tiktoken   # optional: only this tokenizer needs it
        except ImportError:
            raise ValueError("--tokenizer-type TikTokenizer needs the optional `tiktoken` package: "
                             "pip install tiktoken") from None
        if not os.path.isfile(tokenizer_model):
            raise ValueError(f"--tokenizer-model {tokenizer_model}: no such tiktoken vocabulary file")
        vocab_size = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
        if not len(SPECIAL_TOKENS) <= num_special_tokens < vocab_size - 255:
            raise ValueError(f"--tokenizer-type TikTokenizer: --vocab-size {vocab_size} must hold the "
                             f"{num_special_tokens} special tokens and the 256 bytes (Megatron's default 131072)")
        self.special_tokens = list(SPECIAL_TOKENS) + [f"<SPECIAL_{i}>" for i in range(len(SPECIAL_TOKENS),
                                                                                      num_special_tokens)]
        self.num_special_tokens = num_special_tokens
        self._vocab_size = vocab_size
        ranks = _mergeable_ranks(tokenizer_model, vocab_size - num_special_tokens, num_special_tokens)
        self.tokenizer = tiktoken.Encoding(
            name=os.path.basename(os.path.dirname(os.path.abspath(tokenizer_model))),
            pat_str=PATTERNS[pattern or "v2"], mergeable_ranks=ranks,
            special_tokens={token: i for i, token in enumerate(self.special_tokens)})
        self.bos, self.eod = SPECIAL_TOKENS.index("<s>"), SPECIAL_TOKENS.index("</s>")

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def tokenize(self, text: str) -> list[int]:
        # Megatron allows every special token's text to encode as its id.
        return self.tokenizer.encode(text, allowed_special="all")

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])
