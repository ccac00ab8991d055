"""`minitron preprocess`: turn a JSONL corpus into Megatron's indexed-dataset files (.bin + .idx)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from minitron.cli.common import UserError, app, console
from minitron.cli import preflight


@app.command()
def preprocess(
    input: Path = typer.Option(..., "--input", help="JSONL file, one document per line"),
    output_prefix: str = typer.Option(..., "--output-prefix", help="writes PREFIX_<key>_document.bin/.idx"),
    tokenizer_type: str = typer.Option("ByteLevelTokenizer", "--tokenizer-type",
                                       help="ByteLevelTokenizer, GPT2BPETokenizer, HuggingFaceTokenizer, NullTokenizer"),
    vocab_file: Optional[str] = typer.Option(None, "--vocab-file", help="GPT2BPETokenizer: vocab.json"),
    merge_file: Optional[str] = typer.Option(None, "--merge-file", help="GPT2BPETokenizer: merges.txt"),
    tokenizer_model: Optional[str] = typer.Option(None, "--tokenizer-model", help="HuggingFaceTokenizer: tokenizer.json"),
    vocab_size: Optional[int] = typer.Option(None, "--vocab-size", help="NullTokenizer: ids run 0..N-1; N is the end-of-document id"),
    json_keys: List[str] = typer.Option(["text"], "--json-keys", help="the field(s) holding the text"),
    append_eod: bool = typer.Option(False, "--append-eod", help="end every document with the EOD token"),
    workers: int = typer.Option(1, "--workers", help="tokenizing processes"),
    skip_bad_lines: bool = typer.Option(False, "--skip-bad-lines", help="count and report bad lines instead of failing"),
):
    """Tokenize a JSONL corpus into Megatron's indexed-dataset files (.bin + .idx)."""
    preflight.check_workers(workers)
    from minitron.tools.preprocess_data import run_preprocess  # lazy: numpy and rich's bar, for this command only

    try:
        result = run_preprocess(str(input), output_prefix, tokenizer_type=tokenizer_type, vocab_file=vocab_file,
                                merge_file=merge_file, json_keys=json_keys, append_eod=append_eod,
                                workers=workers, skip_bad_lines=skip_bad_lines, tokenizer_model=tokenizer_model,
                                vocab_size=vocab_size)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    console.print(f"{result.documents} documents, {result.tokens} tokens, {result.input_bytes / 2**20:.1f} MB "
                  f"in {result.seconds:.1f} s ({result.mb_per_s:.1f} MB/s)")
    for key, prefix in result.output_prefixes.items():
        console.print(f"  {key}: {prefix}.bin / .idx   (--data-path {prefix})")
    if result.skipped:
        console.print(f"[yellow]skipped {len(result.skipped)} bad lines, e.g. line {result.skipped[0][0]}: "
                      f"{result.skipped[0][1]}[/yellow]")
