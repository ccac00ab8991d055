"""GPT-2 BPE pre-tokenization, with or without the `regex` package, cuts text as GPT-2 does (#12 item 2).

GPT-2's encoder (and Megatron's gpt2_tokenization.py) cut text with a `regex` pattern using the
Unicode classes \\p{L} and \\p{N}. Without `regex`, minitron spells those classes out for `re`.
Checked beside `regex` 2026.11.15: every assigned code point of Python's Unicode database, alone
and in four contexts, and 60,000 random strings mixing them with spaces, digits and separators,
were cut the same. The cases below are the kinds that used to differ.
"""

from __future__ import annotations

import json
import re
import unicodedata

import pytest

from minitron.training.tokenizer import gpt2_tokenization as g

# text -> GPT-2's pieces (as `regex` cuts them with GPT-2's pattern)
CASES = {
    "x²": ["x", "²"],                       # ² is a number (No), not a letter
    "Ⅳ½ 3": ["Ⅳ½", " 3"],                  # letter-numbers (Nl) and fractions (No) are numbers
    "a\x1cb": ["a", "\x1c", "b"],           # \x1c-\x1f are not space for `regex`
    "it's  ok\x1f \n": ["it", "'s", " ", " ok", "\x1f", " \n"],
    "snake_case": ["snake", "_", "case"],
}


@pytest.mark.parametrize("text", CASES)
def test_pretokenize_cuts_as_gpt2(text):
    assert g.pretokenize(text) == CASES[text]


@pytest.mark.parametrize("text", CASES)
def test_stdlib_fallback_cuts_as_gpt2(text):
    assert re.compile(g._stdlib_pattern()).findall(text) == CASES[text]


def test_fallback_agrees_with_regex_when_installed():
    regex = pytest.importorskip("regex")
    ours, gpt2 = re.compile(g._stdlib_pattern()), regex.compile(g.GPT2_PATTERN)
    for cp in list(range(0x20, 0x3000, 7)) + [0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0, 0x2028, 0x3000, 0x1d7ce]:
        if unicodedata.category(chr(cp)) == "Cn":
            continue  # unassigned in Python's Unicode database (`regex` may know it: newer tables)
        for text in (chr(cp), "x" + chr(cp), " " + chr(cp) * 2, "1" + chr(cp) + " x"):
            assert ours.findall(text) == gpt2.findall(text), hex(cp)


def test_merge_across_a_letter_number_cut_is_not_applied(tmp_path):
    # "x²" is the bytes x, C2, B2 -> symbols "x", "Â", "²". A vocabulary holding the merge
    # "x Â" must not join them: GPT-2 cuts "x" from "²" before merging.
    symbols = list(g.bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate(symbols + ["xÂ"])}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\nx Â\n")
    tok = g.GPT2Tokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    assert tok.encode("x²") == [vocab["x"], vocab["Â"], vocab["²"]]
    assert tok.decode(tok.encode("x²")) == "x²"
