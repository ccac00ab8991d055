"""build_tokenizer: the tokenizer named by --tokenizer-type, and the padded vocabulary size.

Every tokenizer answers the same few questions: ``tokenize(text) -> ids``, ``detokenize(ids)``,
``vocab_size`` and ``eod`` (the end-of-document id that preprocessing appends and the dataset's
masks look for). The type names are Megatron's where Megatron has the type:

    NullTokenizer        the text *is* ids ("17 4 99"); vocabulary --vocab-size, eod = its last id + 1
    ByteLevelTokenizer   UTF-8 bytes are the ids (0-255), eod = 256; nothing to download or load
    GPT2BPETokenizer     GPT-2 byte-level BPE from --vocab-file (JSON) and --merge-file
    HuggingFaceTokenizer a tokenizer.json given as --tokenizer-model (needs the `tokenizers` package)
    GPTSentencePieceTokenizer, Llama2Tokenizer   a SentencePiece --tokenizer-model (`sentencepiece`)
    TikTokenizer         tiktoken's vocabulary JSON as --tokenizer-model (`tiktoken`), --vocab-size in all

ByteLevelTokenizer is Megatron Core's byte-level library tokenizer with one change: Megatron puts
eod at id 0, which is also the NUL byte; we give it its own id after the 256 bytes.
"""

from __future__ import annotations

import importlib.util
import os

from minitron.trace import traced
from minitron.training.tokenizer.sentencepiece_tokenizer import SentencePieceTokenizer
from minitron.training.tokenizer.tiktoken_tokenizer import TikTokenizer


class NullTokenizer:
    def __init__(self, vocab_size: int):
        # Megatron's NullTokenizer reserves the id after the vocabulary for end-of-document.
        self._vocab_size = vocab_size + 1
        self._eod = vocab_size

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eod(self) -> int:
        return self._eod

    def tokenize(self, text: str) -> list[int]:
        try:
            return [int(t) for t in text.split()]
        except ValueError:
            raise ValueError("NullTokenizer reads whitespace-separated integers; "
                             "for text use --tokenizer-type ByteLevelTokenizer or GPT2BPETokenizer") from None

    def detokenize(self, ids) -> str:
        return " ".join(str(int(i)) for i in ids)


class ByteLevelTokenizer:
    """Each UTF-8 byte is a token: a 257-id vocabulary that can spell any text."""

    vocab_size = 257
    eod = 256

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def tokenize_bytes(self, text: str) -> bytes:
        """The same ids as a bytes object: the preprocessing fast path (no list of ints)."""
        return text.encode("utf-8")

    def detokenize(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


class GPT2BPETokenizer:
    def __init__(self, vocab_file: str | None, merge_file: str | None):
        if not vocab_file or not merge_file:
            raise ValueError("--tokenizer-type GPT2BPETokenizer needs --vocab-file VOCAB.json and "
                             "--merge-file MERGES.txt (`python -m minitron.tools.train_bpe` makes a pair)")
        # Lazy: the BPE code loads for this tokenizer only; every command that checks Megatron's
        # flags imports this module.
        from minitron.training.tokenizer.gpt2_tokenization import ENDOFTEXT, GPT2Tokenizer
        self.tokenizer = GPT2Tokenizer(vocab_file, merge_file)
        if ENDOFTEXT not in self.tokenizer.encoder:
            raise ValueError(f"--vocab-file {vocab_file} has no {ENDOFTEXT} entry for end-of-document")
        self.eod = self.tokenizer.encoder[ENDOFTEXT]

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer.encoder)

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode(ids)


class HuggingFaceTokenizer:
    """A ``tokenizer.json`` read by the `tokenizers` package (optional: pip install tokenizers)."""

    def __init__(self, tokenizer_model: str | None):
        if not tokenizer_model:
            raise ValueError("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model PATH/tokenizer.json")
        try:
            from tokenizers import Tokenizer  # optional: only this tokenizer needs the package
        except ImportError:
            raise ValueError("--tokenizer-type HuggingFaceTokenizer needs the optional `tokenizers` "
                             "package: pip install tokenizers") from None
        path = tokenizer_model
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            # Megatron would download a hub name here; minitron never touches the network.
            raise ValueError(f"--tokenizer-model {tokenizer_model}: no such tokenizer.json file")
        try:
            self.tokenizer = Tokenizer.from_file(path)
        except Exception as err:  # the Rust side raises its own exception type
            raise ValueError(f"--tokenizer-model {path}: not a tokenizers JSON file ({err})") from None
        self._vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.eod = next((self.tokenizer.token_to_id(t) for t in ("<|endoftext|>", "</s>", "<eos>", "[SEP]")
                         if self.tokenizer.token_to_id(t) is not None), None)
        if self.eod is None:
            raise ValueError(f"--tokenizer-model {path}: found no end-of-document token "
                             "(<|endoftext|>, </s>, <eos> or [SEP])")

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])


TOKENIZER_TYPES = ("NullTokenizer", "ByteLevelTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer",
                   "GPTSentencePieceTokenizer", "Llama2Tokenizer", "TikTokenizer")


# The tokenizers whose package minitron does not require: validate_args asks for the package (and
# the model file) before any rank starts; the package itself is imported only by the rank.
OPTIONAL_PACKAGES = {"HuggingFaceTokenizer": "tokenizers", "GPTSentencePieceTokenizer": "sentencepiece",
                     "Llama2Tokenizer": "sentencepiece", "TikTokenizer": "tiktoken"}


def check_tokenizer_model(tokenizer_type: str, tokenizer_model) -> str | None:
    """Torch-free and import-free: what is missing for a tokenizer that reads --tokenizer-model
    through an optional package (one line), or None."""
    package = OPTIONAL_PACKAGES.get(tokenizer_type)
    if package is None or tokenizer_type == "HuggingFaceTokenizer":   # (its own checks, in datasets/arguments.py)
        return None
    if not tokenizer_model:
        return f"--tokenizer-type {tokenizer_type} needs --tokenizer-model PATH"
    if not os.path.isfile(tokenizer_model):
        return f"--tokenizer-model {tokenizer_model}: no such file"
    if importlib.util.find_spec(package) is None:
        return f"--tokenizer-type {tokenizer_type} needs the optional `{package}` package: pip install {package}"
    return None


def make_tokenizer(tokenizer_type: str, vocab_file=None, merge_file=None, tokenizer_model=None,
                   vocab_size=None, tiktoken_pattern=None, tiktoken_num_special_tokens=1000):
    """The tokenizer alone (no padding arithmetic): what preprocessing needs."""
    if tokenizer_type == "NullTokenizer":
        if vocab_size is None or vocab_size < 1:
            raise ValueError("--tokenizer-type NullTokenizer needs --vocab-size N")
        return NullTokenizer(vocab_size)
    if tokenizer_type == "ByteLevelTokenizer":
        return ByteLevelTokenizer()
    if tokenizer_type == "GPT2BPETokenizer":
        return GPT2BPETokenizer(vocab_file, merge_file)
    if tokenizer_type == "HuggingFaceTokenizer":
        return HuggingFaceTokenizer(tokenizer_model)
    if tokenizer_type in ("GPTSentencePieceTokenizer", "Llama2Tokenizer"):   # their modules import lazily
        return SentencePieceTokenizer(tokenizer_model, tokenizer_type)
    if tokenizer_type == "TikTokenizer":
        return TikTokenizer(tokenizer_model, vocab_size, tiktoken_pattern, tiktoken_num_special_tokens)
    raise ValueError(f"--tokenizer-type {tokenizer_type} is not available; choose one of {', '.join(TOKENIZER_TYPES)}")


def _vocab_size_with_padding(orig_vocab_size: int, make_vocab_size_divisible_by: int,
                             tensor_model_parallel_size: int) -> int:
    """Round the vocabulary up to a multiple of ``make_vocab_size_divisible_by x tp``.

    Why pad at all: the embedding and the output layer are split by vocabulary rows, so each
    rank needs the same number of rows, and a multiple of 128 per rank keeps GPU matrix tiles
    full. The extra rows are ids no tokenizer ever produces; their logits are trained towards
    never being chosen, which costs a few wasted rows and nothing else.
    """
    if orig_vocab_size < 1 or make_vocab_size_divisible_by < 1 or tensor_model_parallel_size < 1:
        raise ValueError("vocabulary size, --make-vocab-size-divisible-by and "
                         "--tensor-model-parallel-size must all be positive")
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return -(-orig_vocab_size // multiple) * multiple


@traced(args=lambda args: {"tokenizer_type": args.tokenizer_type})
def build_tokenizer(args):
    """The tokenizer for ``args``; also sets ``args.padded_vocab_size`` (as Megatron does)."""
    tokenizer = make_tokenizer(args.tokenizer_type, args.vocab_file, args.merge_file, args.tokenizer_model,
                               args.vocab_size, getattr(args, "tiktoken_pattern", None),
                               getattr(args, "tiktoken_num_special_tokens", 1000))
    if getattr(args, "padded_vocab_size", None) is None:   # --padded-vocab-size (or a checkpoint) may set it
        args.padded_vocab_size = _vocab_size_with_padding(
            tokenizer.vocab_size, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size)
    elif args.padded_vocab_size < tokenizer.vocab_size:
        raise ValueError(f"--padded-vocab-size {args.padded_vocab_size} is smaller than the tokenizer's "
                         f"vocabulary ({tokenizer.vocab_size}): every token id needs a row")
    return tokenizer
