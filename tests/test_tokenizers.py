"""Megatron's SentencePiece and tiktoken tokenizers (GPTSentencePieceTokenizer, Llama2Tokenizer,
TikTokenizer) on tiny models made here: ids, text, vocabulary size and end-of-document as
Megatron 0.19.2's wrappers define them, and the one line a user without the package gets."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

from minitron.training.argument_groups import ArgumentError
from minitron.training.tokenizer.tokenizer import check_tokenizer_model, make_tokenizer

TEXT = ["the quick brown fox jumps over the lazy dog", "hello world, hello again", "a tiny corpus for a tiny model",
        "sentencepiece learns pieces from these lines", "the dog sleeps and the fox runs"]


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    spm = pytest.importorskip("sentencepiece")
    where = tmp_path_factory.mktemp("spm")
    (where / "corpus.txt").write_text("\n".join(TEXT * 4))
    spm.SentencePieceTrainer.train(input=str(where / "corpus.txt"), model_prefix=str(where / "tiny"), vocab_size=60,
                                   model_type="bpe", minloglevel=2)
    return str(where / "tiny.model")


@pytest.mark.parametrize("kind", ["GPTSentencePieceTokenizer", "Llama2Tokenizer"])
def test_sentencepiece_as_megatron_wraps_it(sp_model, kind):
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=sp_model)
    tok = make_tokenizer(kind, tokenizer_model=sp_model)
    assert tok.vocab_size == sp.get_piece_size() == 60
    assert tok.eod == sp.eos_id() == 2                           # </s>
    ids = tok.tokenize("the lazy fox")
    assert ids == sp.encode_as_ids("the lazy fox") and sp.bos_id() not in ids   # no BOS added
    assert tok.detokenize(ids) == "the lazy fox"


def _tiktoken_file(path, merges=(b"he", b"ll", b"hell", b"hello")):
    tokens = [bytes([i]) for i in range(256)] + list(merges)
    path.write_text(json.dumps([{"rank": i, "token_bytes": base64.b64encode(t).decode(), "token_str": t.decode("latin-1")}
                                for i, t in enumerate(tokens)]))
    return str(path)


def test_tiktoken_as_megatron_wraps_it(tmp_path):
    pytest.importorskip("tiktoken")
    vocab = _tiktoken_file(tmp_path / "vocab.json")
    tok = make_tokenizer("TikTokenizer", tokenizer_model=vocab, vocab_size=1000 + 260)
    assert tok.vocab_size == 1260 and tok.eod == 2              # </s>, after <unk> <s>
    assert tok.tokenize("hello") == [1000 + 259]                # rank 259, shifted past 1000 special ids
    assert tok.tokenize("hi</s>") == [1000 + ord("h"), 1000 + ord("i"), 2]
    assert tok.detokenize(tok.tokenize("hello, hell!")) == "hello, hell!"
    # --vocab-size cuts the file: without ranks 258 and 259, "hello" is he + ll + o
    cut = make_tokenizer("TikTokenizer", tokenizer_model=vocab, vocab_size=1000 + 258, tiktoken_num_special_tokens=1000)
    assert cut.tokenize("hello") == [1256, 1257, 1000 + ord("o")]
    with pytest.raises(ValueError, match="--vocab-size"):
        make_tokenizer("TikTokenizer", tokenizer_model=vocab, vocab_size=1000 + 300)   # more than the file holds


def test_a_missing_package_or_model_is_one_line(tmp_path, monkeypatch):
    import importlib.util
    model = tmp_path / "tiny.model"
    model.write_bytes(b"x")
    assert check_tokenizer_model("Llama2Tokenizer", None) == "--tokenizer-type Llama2Tokenizer needs --tokenizer-model PATH"
    assert "no such file" in check_tokenizer_model("TikTokenizer", str(tmp_path / "absent.json"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert check_tokenizer_model("GPTSentencePieceTokenizer", str(model)) == (
        "--tokenizer-type GPTSentencePieceTokenizer needs the optional `sentencepiece` package: pip install sentencepiece")
    monkeypatch.setitem(sys.modules, "tiktoken", None)        # the rank's side: import fails
    with pytest.raises(ValueError, match="pip install tiktoken"):
        make_tokenizer("TikTokenizer", tokenizer_model=str(model), vocab_size=2000)


def test_validate_args_refuses_before_any_rank(tmp_path):
    from minitron.training.arguments import megatron_parser, validate_args
    args = megatron_parser().parse_args(["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2",
                                         "--seq-length", "8", "--micro-batch-size", "1", "--mock-data",
                                         "--tokenizer-type", "TikTokenizer"])
    args.rank, args.world_size, args.distributed_backend = 0, 1, "gloo"
    with pytest.raises(ArgumentError, match="^--tokenizer-type TikTokenizer needs --tokenizer-model PATH$"):
        validate_args(args)


def test_null_tokenizer_imports_neither_package():
    code = ("import sys; from minitron.training.tokenizer.tokenizer import make_tokenizer; "
            "make_tokenizer('NullTokenizer', vocab_size=7); print(sorted({'sentencepiece', 'tiktoken'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
