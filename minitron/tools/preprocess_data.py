"""Preprocess: JSONL text -> PREFIX_{key}_document.bin/.idx, the files GPTDataset reads.

    python -m minitron.tools.preprocess_data --input corpus.jsonl --output-prefix data/corpus \\
        --tokenizer-type ByteLevelTokenizer --append-eod --workers 2

The job of Megatron's tools/preprocess_data.py. Each input line is one JSON object; the strings
under ``--json-keys`` are tokenized (one document per line and key) and appended to one
IndexedDatasetBuilder per key. With ``--append-eod`` every document ends with the tokenizer's
end-of-document id, which is how a model that reads documents glued end to end sees where one
stops.

Tokenizing is the slow part, so it runs in ``--workers`` processes. This process reads batches
of lines, keeps a few batches per worker in flight, and writes the results *in input order*, so
the output is the same whatever the number of workers. With one worker there is no pool at all.
The first batch is tokenized by this process, before any output, bar or worker: a file that
is not JSONL at all is refused in a fraction of a second.

An interrupted run never leaves a pair that looks complete: both files are written under
temporary names, and the .idx (which a reader opens first) is renamed into place last.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn, TransferSpeedColumn)

from minitron.core.datasets.indexed_dataset_format import DType, IndexedDatasetBuilder  # numpy only
from minitron.tools.preprocess_encoder import encode_batch, init_worker
from minitron.tools.preprocess_workers import Workers
from minitron.training.tokenizer import TOKENIZER_TYPES, make_tokenizer

_BATCH_BYTES = 1 << 20  # lines per task: about 1 MB, enough to make the pickling overhead small
# The longest line (one document) read: a whole book is a few MB. A file without newlines (a
# binary, a JSON array pretty-printed on one line of gigabytes) would otherwise be held whole in
# memory before the first complaint.
MAX_LINE_BYTES = 64 << 20


@dataclass
class PreprocessResult:
    output_prefixes: dict[str, str]  # json key -> prefix of its .bin/.idx pair
    documents: int
    tokens: int
    input_bytes: int
    seconds: float
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line number, reason)
    empty: int = 0  # documents with no token: kept, with no sequence (see encode_batch)

    @property
    def mb_per_s(self) -> float:
        return self.input_bytes / 2**20 / max(self.seconds, 1e-9)


def _batches(path: str, lineno: int = 1, offset: int = 0):
    """(first line number, bytes) blocks of about _BATCH_BYTES, each cut after a newline, from
    byte ``offset`` (the start of line ``lineno``) on. A line longer than MAX_LINE_BYTES is
    refused as soon as it is that long."""
    pending, pending_bytes = [], 0  # pending: the pieces of an unfinished line
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            chunk = f.read(_BATCH_BYTES)
            if not chunk:
                if pending:
                    yield lineno, b"".join(pending)  # a last line without its newline
                return
            cut = chunk.rfind(b"\n") + 1
            if cut == 0:  # one line longer than a block: read on, keeping the pieces
                pending.append(chunk)
                pending_bytes += len(chunk)
                if pending_bytes > MAX_LINE_BYTES:
                    raise ValueError(f"{path}:{lineno}: a line longer than {MAX_LINE_BYTES >> 20} MiB, the most one "
                                     f"document may take; a JSONL file has one JSON object per line")
                continue
            block = b"".join(pending) + chunk[:cut] if pending else chunk[:cut]
            yield lineno, block
            lineno += block.count(b"\n")
            pending = [chunk[cut:]] if cut < len(chunk) else []
            pending_bytes = len(chunk) - cut


def _refuse_bad_lines(input: str, bad: list, skip_bad_lines: bool) -> None:
    if bad and not skip_bad_lines:
        lineno, reason = bad[0]
        raise ValueError(f"{input}:{lineno}: {reason}; fix the line or pass --skip-bad-lines")


class _Bar(Progress):
    def __exit__(self, exc_type, *rest):
        if exc_type is not None and not self.disable:  # refused or interrupted: the error stands alone
            self.live.transient = True
            self.live.stop()  # not Progress.stop: where stderr is no terminal, it adds an empty line
            return None
        return super().__exit__(exc_type, *rest)


def _progress(enabled: bool, total: int):
    return _Bar(TextColumn("[bold]tokenizing"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                TextColumn("{task.fields[docs]:>9,} docs"), TimeElapsedColumn(), TimeRemainingColumn(),
                console=Console(stderr=True), disable=not enabled, transient=False)


def run_preprocess(input: str, output_prefix: str, tokenizer_type: str = "ByteLevelTokenizer",
                   vocab_file: str | None = None, merge_file: str | None = None,
                   json_keys=("text",), append_eod: bool = False, workers: int = 1,
                   skip_bad_lines: bool = False, tokenizer_model: str | None = None,
                   vocab_size: int | None = None, progress: bool = True) -> PreprocessResult:
    """Tokenize ``input`` into one .bin/.idx pair per json key. Bad input raises ValueError."""
    if not os.path.isfile(input):
        raise ValueError(f"--input {input}: no such file")
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    json_keys = list(json_keys)
    if not json_keys:
        raise ValueError("--json-keys needs at least one key (e.g. text)")
    if not os.path.basename(output_prefix) or os.path.basename(output_prefix) in (".", ".."):
        # '' or 'data/' would write hidden files named _text_document.bin/.idx
        raise ValueError(f"--output-prefix {output_prefix!r} has no file name; give one such as data/corpus "
                         f"(it writes data/corpus_{json_keys[0]}_document.bin and .idx)")
    tok_args = dict(tokenizer_type=tokenizer_type, vocab_file=vocab_file, merge_file=merge_file,
                    tokenizer_model=tokenizer_model, vocab_size=vocab_size)
    tokenizer = make_tokenizer(**tok_args)  # fail here, once, before any worker starts
    dtype = np.dtype(DType.optimal_dtype(tokenizer.vocab_size))
    spec = {"tokenizer": tok_args, "json_keys": json_keys, "append_eod": append_eod, "dtype": dtype}
    # The first batch is tokenized here, before any output is opened, bar drawn or worker
    # started: a corpus that is not JSONL at all (the common mistake) is refused at once.
    start = time.perf_counter()
    first = next(_batches(input), None)  # its generator is dropped, and its file closed, here
    init_worker(spec)
    done = [encode_batch(first)] if first is not None else []
    for _, bad, _, _ in done:
        _refuse_bad_lines(input, bad, skip_bad_lines)
    # the batches after the first, read from where it ended
    rest = _batches(input, first[0] + first[1].count(b"\n"), len(first[1])) if first is not None else iter(())

    prefixes = {key: f"{output_prefix}_{key}_document" for key in json_keys}
    tmp = {key: (f"{p}.bin.tmp{os.getpid()}", f"{p}.idx.tmp{os.getpid()}") for key, p in prefixes.items()}
    try:
        os.makedirs(os.path.dirname(os.path.abspath(output_prefix)), exist_ok=True)
        builders = {key: IndexedDatasetBuilder(tmp[key][0], dtype) for key in json_keys}
    except OSError as err:
        raise ValueError(f"--output-prefix {output_prefix}: cannot write there ({err.strerror})") from None
    result = PreprocessResult(prefixes, 0, 0, 0, 0.0)
    pool = None
    try:
        if workers == 1:
            results = itertools.chain(done, map(encode_batch, rest))
        else:
            pool = Workers(workers, init_worker, spec, encode_batch)
            results = itertools.chain(done, pool.ordered(rest))
        with _progress(progress, os.path.getsize(input)) as bar:
            task = bar.add_task("tokenizing", total=os.path.getsize(input), docs=0)
            for arrays, bad, empty, nbytes in results:
                _refuse_bad_lines(input, bad, skip_bad_lines)
                result.skipped.extend(bad)
                result.empty += empty
                result.input_bytes += nbytes
                for key, (tokens, lengths) in arrays.items():
                    # One sequence per document: Megatron splits sentences only for BERT.
                    builders[key].add_flat_documents(tokens, lengths)
                result.documents += len(arrays[json_keys[0]][1])
                result.tokens += int(sum(len(t) for t, _ in arrays.values()))
                bar.update(task, advance=nbytes, docs=result.documents)
        if result.tokens == 0:
            raise ValueError(f"--input {input}: no tokens to write (every line was blank, empty or skipped)")
        for key in json_keys:
            builders[key].finalize(tmp[key][1])
        for key, prefix in prefixes.items():
            # Old .idx out first, then the new .bin, then the new .idx: at no moment does a
            # complete-looking pair mix old and new files.
            if os.path.exists(prefix + ".idx"):
                os.remove(prefix + ".idx")
            os.replace(tmp[key][0], prefix + ".bin")
            os.replace(tmp[key][1], prefix + ".idx")
    finally:
        if pool is not None:
            pool.stop()
        for key in json_keys:
            builders[key].data_file.close()
            for path in tmp[key]:
                if os.path.exists(path):
                    os.remove(path)
    result.seconds = time.perf_counter() - start
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minitron.tools.preprocess_data",
                                description="Tokenize a JSONL corpus into indexed .bin/.idx files.")
    p.add_argument("--input", required=True, help="JSONL file, one JSON object per line")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX_{key}_document.bin/.idx")
    p.add_argument("--json-keys", nargs="+", default=["text"], help="keys whose strings are documents")
    p.add_argument("--tokenizer-type", default="ByteLevelTokenizer", choices=TOKENIZER_TYPES)
    p.add_argument("--vocab-file", default=None, help="GPT2BPETokenizer: vocab.json")
    p.add_argument("--merge-file", default=None, help="GPT2BPETokenizer: merges.txt")
    p.add_argument("--tokenizer-model", default=None, help="HuggingFaceTokenizer: tokenizer.json")
    p.add_argument("--vocab-size", type=int, default=None, help="NullTokenizer: vocabulary size")
    p.add_argument("--append-eod", action="store_true", help="end every document with the eod id")
    p.add_argument("--workers", type=int, default=1, help="tokenizing processes")
    p.add_argument("--skip-bad-lines", action="store_true", help="count and report bad lines instead of stopping")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        r = run_preprocess(args.input, args.output_prefix, args.tokenizer_type, args.vocab_file,
                           args.merge_file, args.json_keys, args.append_eod, args.workers,
                           args.skip_bad_lines, args.tokenizer_model, args.vocab_size, args.progress)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(summary(r))
    return 0


def summary(r: PreprocessResult) -> str:
    lines = [f"wrote {prefix}.bin/.idx" for prefix in r.output_prefixes.values()]
    lines.append(f"{r.documents:,} documents, {r.tokens:,} tokens from {r.input_bytes / 2**20:.1f} MB "
                 f"in {r.seconds:.2f} s ({r.mb_per_s:.1f} MB/s)")
    if r.skipped:
        shown = ", ".join(f"line {n} ({why})" for n, why in r.skipped[:3])
        lines.append(f"skipped {len(r.skipped)} bad line(s): {shown}{' ...' if len(r.skipped) > 3 else ''}")
    if r.empty:
        lines.append(f"{r.empty} empty document(s) kept as documents with no sequence, as Megatron does")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
