"""minitron preprocess and the tokenizers behind it."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from minitron.core.datasets import IndexedDataset
from minitron.tools import preprocess_data
from minitron.tools.preprocess_data import run_preprocess
from minitron.tools.train_bpe import count_words, learn_merges, write_bpe
from minitron.training.tokenizer import GPT2BPETokenizer, make_tokenizer

TEXTS = ["hello world", "café au lait", "", "the third document, the end"]


def jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" if not isinstance(r, str) else r for r in records))
    return str(path)


def test_byte_level_documents_and_eod(tmp_path):
    src = jsonl(tmp_path / "in.jsonl", [{"text": t} for t in TEXTS] + ["\n"])
    result = run_preprocess(src, str(tmp_path / "out"), "ByteLevelTokenizer", append_eod=True, progress=False)
    assert result.documents == 4 and result.empty == 1          # the empty text stays a document...
    ds = IndexedDataset(result.output_prefixes["text"])
    assert len(ds) == 3 and ds.document_indices.tolist() == [0, 1, 2, 2, 3]  # ...with no sequence
    assert ds.dtype == np.uint16                                 # 257 ids fit in 16 bits
    for doc, text in zip(ds, [t for t in TEXTS if t]):
        assert doc[-1] == 256                                    # eod after every document
        assert bytes(doc[:-1].astype(np.uint8)).decode() == text
    assert result.tokens == sum(len(t.encode()) + 1 for t in TEXTS if t)


def test_two_workers_write_the_same_files_as_one(tmp_path, monkeypatch):
    monkeypatch.setattr(preprocess_data, "_BATCH_BYTES", 64)  # many small batches, out of order in flight
    src = jsonl(tmp_path / "in.jsonl", [{"text": f"document {i} " * (i % 7 + 1)} for i in range(200)])
    one = run_preprocess(src, str(tmp_path / "one"), append_eod=True, workers=1, progress=False)
    two = run_preprocess(src, str(tmp_path / "two"), append_eod=True, workers=2, progress=False)
    for ext in (".bin", ".idx"):
        a = open(one.output_prefixes["text"] + ext, "rb").read()
        assert a == open(two.output_prefixes["text"] + ext, "rb").read()


def test_bad_line_names_its_number_and_leaves_no_files(tmp_path, monkeypatch):
    monkeypatch.setattr(preprocess_data, "_BATCH_BYTES", 16)  # line numbers must survive the batching
    src = jsonl(tmp_path / "in.jsonl", [{"text": "ok"}, "\n", {"text": "a longer line"}, {"text": "ok"},
                                         '{"text": "unterminated\n', {"text": "ok"}])
    with pytest.raises(ValueError, match=r"in\.jsonl:5: not valid JSON.*--skip-bad-lines"):
        run_preprocess(src, str(tmp_path / "out"), progress=False)
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]         # no pair, no temporary files
    src = jsonl(tmp_path / "in.jsonl", [{"text": "ok"}, {"body": "no text key"}])
    with pytest.raises(ValueError, match=r":2: no string under key 'text'"):
        run_preprocess(src, str(tmp_path / "out"), progress=False)


def test_a_corpus_bad_at_line_1_is_refused_before_anything_starts(tmp_path, monkeypatch):
    """The first batch is tokenized in this process before a worker, the bar or an output file."""
    def started(*args, **kwargs):
        raise AssertionError("started before the first batch of lines was checked")
    for name in ("Workers", "_progress", "IndexedDatasetBuilder"):
        monkeypatch.setattr(preprocess_data, name, started, raising=name != "IndexedDatasetBuilder")
    src = jsonl(tmp_path / "in.jsonl", ['{"text": \n', {"text": "ok"}])
    with pytest.raises(ValueError, match=r"in\.jsonl:1: not valid JSON"):
        run_preprocess(src, str(tmp_path / "sub" / "out"), workers=2)
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]         # not even the output's folder


def test_a_refusal_under_the_bar_prints_only_the_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(preprocess_data, "_BATCH_BYTES", 16)  # the bad line comes after the bar started
    src = jsonl(tmp_path / "in.jsonl", [{"text": "ok"}] * 4 + ["{bad\n"])
    assert preprocess_data.main(["--input", src, "--output-prefix", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err  # not a terminal: rich's Progress would end with an empty line
    assert err.startswith(f"error: {src}:5: not valid JSON") and err.count("\n") == 1, repr(err)


@pytest.mark.parametrize("text, words", [
    ("1 2 70000", "token id 70000 is outside the vocabulary (ids 0..100"),   # uint16 would overflow
    ("1 -2", "token id -2 is outside"),
    ("1 " + "9" * 30, "token id 99999999999999999999 is outside"),            # beyond int64 too
])
def test_null_tokenizer_ids_outside_the_vocabulary(tmp_path, text, words):
    src = jsonl(tmp_path / "in.jsonl", [{"text": "1 2"}, {"text": text}])
    with pytest.raises(ValueError, match=r":2: " + re.escape(words)):
        run_preprocess(src, str(tmp_path / "out"), "NullTokenizer", vocab_size=100, progress=False)
    result = run_preprocess(jsonl(tmp_path / "ok.jsonl", [{"text": "0 99 100"}]), str(tmp_path / "out"),
                            "NullTokenizer", vocab_size=100, progress=False)
    assert result.tokens == 3   # 100 is the end-of-document id, inside the vocabulary


def test_nesting_and_long_lines_are_bad_lines(tmp_path, monkeypatch):
    src = jsonl(tmp_path / "in.jsonl", [{"text": "ok"}, "[" * 10000 + "]" * 10000 + "\n"])
    with pytest.raises(ValueError, match=r":2: JSON nested too deeply"):
        run_preprocess(src, str(tmp_path / "out"), progress=False)
    result = run_preprocess(src, str(tmp_path / "out"), skip_bad_lines=True, progress=False)
    assert result.documents == 1 and result.skipped[0][0] == 2
    monkeypatch.setattr(preprocess_data, "MAX_LINE_BYTES", 100)
    monkeypatch.setattr(preprocess_data, "_BATCH_BYTES", 16)   # the long line spans many reads
    src = jsonl(tmp_path / "long.jsonl", [{"text": "ok"}, {"text": "x" * 200}])
    with pytest.raises(ValueError, match=r"long\.jsonl:2: a line longer than 0 MiB"):
        run_preprocess(src, str(tmp_path / "out"), progress=False)
    monkeypatch.setattr(preprocess_data, "MAX_LINE_BYTES", 300)   # just fits: read whole, in order
    assert run_preprocess(src, str(tmp_path / "out"), progress=False).documents == 2


def test_an_output_prefix_needs_a_file_name(tmp_path):
    src = jsonl(tmp_path / "in.jsonl", [{"text": "ok"}])
    for prefix in ("", str(tmp_path) + os.sep, "."):
        with pytest.raises(ValueError, match="has no file name"):
            run_preprocess(src, prefix, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_skip_bad_lines_counts_them(tmp_path, capsys):
    src = jsonl(tmp_path / "in.jsonl", [{"text": "a"}, "[1, 2\n", {"text": 3}, {"text": "b"}])
    code = preprocess_data.main(["--input", src, "--output-prefix", str(tmp_path / "o"),
                                 "--skip-bad-lines", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and "skipped 2 bad line(s): line 2 (not valid JSON" in out and "line 3 (" in out
    assert len(IndexedDataset(str(tmp_path / "o_text_document"))) == 2


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert preprocess_data.main(["--input", str(tmp_path / "missing.jsonl"), "--output-prefix", "x"]) == 1
    assert capsys.readouterr().err.strip() == f"error: --input {tmp_path / 'missing.jsonl'}: no such file"
    src = jsonl(tmp_path / "in.jsonl", [{"text": "a"}])
    assert preprocess_data.main(["--input", src, "--output-prefix", "x", "--tokenizer-type", "GPT2BPETokenizer"]) == 1
    assert "needs --vocab-file" in capsys.readouterr().err


def tiny_bpe(tmp_path):
    """256 byte symbols plus three merges: 'Ġ'+'t' -> 'Ġt', 'h'+'e' -> 'he', 'Ġt'+'he' -> 'Ġthe'."""
    write_bpe([("Ġ", "t"), ("h", "e"), ("Ġt", "he")], str(tmp_path))
    return GPT2BPETokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))


def test_gpt2_bpe_applies_merges_by_rank(tmp_path):
    tok = tiny_bpe(tmp_path)
    vocab = tok.tokenizer.encoder
    assert tok.vocab_size == 256 + 3 + 1 and tok.eod == vocab["<|endoftext|>"] == 259
    # "the the": 't' 'h' 'e' (only 'he' applies), then ' the' -> 'Ġt' 'he' -> 'Ġthe'.
    assert tok.tokenize("the the") == [vocab["t"], vocab["he"], vocab["Ġthe"]]
    for text in ["the the", "naïve café — 3.5 µs", "  spaces\n\tand tabs  "]:
        assert tok.detokenize(tok.tokenize(text)) == text


def test_train_bpe_learns_the_most_frequent_pair_first(tmp_path):
    merges = learn_merges(count_words(["aaab aaab aaab xy"]), 3)
    assert merges[0] == ("a", "a")
    write_bpe(merges, str(tmp_path))
    tok = GPT2BPETokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    assert tok.detokenize(tok.tokenize("aaab xy")) == "aaab xy"
    assert len(tok.tokenize("aaab")) < 4


def test_huggingface_tokenizer_file_or_a_clear_error(tmp_path):
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="pip install tokenizers"):
            make_tokenizer("HuggingFaceTokenizer", tokenizer_model=str(tmp_path / "tokenizer.json"))
        return
    from tokenizers import Tokenizer, models, pre_tokenizers
    ours = tiny_bpe(tmp_path)
    hf = Tokenizer(models.BPE.from_file(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.save(str(tmp_path / "tokenizer.json"))
    wrapped = make_tokenizer("HuggingFaceTokenizer", tokenizer_model=str(tmp_path / "tokenizer.json"))
    assert wrapped.eod == ours.eod
    assert wrapped.tokenize("the the café") == ours.tokenize("the the café")
