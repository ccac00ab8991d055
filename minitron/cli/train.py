"""`minitron pretrain` and `minitron preprocess`: train a GPT on many ranks, and turn a JSONL
corpus into indexed-dataset files."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from minitron.cli.common import (
    DEBUG, DEBUG_HOST, DEBUG_PORT_BASE, DEBUG_WAIT, EXTRA, DebugOptions, UserError, app, rank_backend,
    check_world, console, validate_pretrain,
)
from minitron.cli import preflight

@app.command(context_settings=EXTRA)
def pretrain(
    ctx: typer.Context,
    world: int = typer.Option(1, "--world", "-w", help="number of ranks"),
    backend: Optional[str] = typer.Option(None, "--backend", help="gloo (forked CPU ranks) or nccl (one GPU each)"),
    log_dir: Path = typer.Option(Path("minitron-logs"), "--log-dir", help="per-rank logs"),
    master_port: Optional[int] = typer.Option(None, "--master-port"),
    trace_dir: Optional[Path] = typer.Option(None, "--trace", help="record every rank's calls into this directory"),
    debug: Optional[str] = DEBUG, debug_port_base: int = DEBUG_PORT_BASE, debug_host: str = DEBUG_HOST,
    debug_wait_timeout: float = DEBUG_WAIT,
):
    """Train a GPT on WORLD ranks. Every other flag is Megatron's, passed to each rank
    (--tensor-model-parallel-size, --num-layers, --train-iters, --lr, --mock-data, ...)."""
    fake = "--backend fake moves no data, so it cannot train: use gloo or nccl"
    check_world(world)
    argv = list(ctx.args)
    if backend is not None:  # given: check it now, and every rank uses it
        rank_backend(backend, world, fake)
        if "--distributed-backend" not in argv:
            argv += ["--distributed-backend", backend]
    if "--log-jsonl" not in argv:  # the progress display reads it, so there is always one
        argv += ["--log-jsonl", str((log_dir / "iterations.jsonl").resolve())]
    # Every refusal happens here, before torch is imported: validate_args asks the accelerator
    # for the default backend only once the flags have passed.
    args = validate_pretrain(argv, world)
    if not args.train_iters:
        raise UserError("--train-iters N or --train-samples N is required; `minitron trace` shows "
                        "initialization alone")
    preflight.check_launch(world, args.distributed_backend or "gloo", master_port,
                           {"--log-dir": log_dir, "--trace": trace_dir, "--save": args.save})
    preflight.check_output_file(args.log_jsonl, "--log-jsonl")
    backend = rank_backend(args.distributed_backend, world, fake)  # None: the accelerator's default

    # Lazy: the launcher and the run's console load once every check above has passed (`--help`
    # and a refusal never pay for them).
    from minitron.launcher import LaunchConfig, Target
    from minitron.launcher import launch as run
    from minitron.training.progress import PretrainProgress
    from minitron.training.utils import CONSOLE_ENV
    log_jsonl = Path(args.log_jsonl)
    # The ranks append the lines Megatron prints for the console here; we show them as they come.
    console_jsonl = (log_dir / "console.jsonl").resolve()
    for path in (log_jsonl, console_jsonl):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
    env = {CONSOLE_ENV: str(console_jsonl)}
    env.update(DebugOptions(debug, debug_port_base, debug_host, debug_wait_timeout).env(world, trace_dir))
    cfg = LaunchConfig(world_size=world, backend=backend, log_dir=log_dir, master_port=master_port, env=env)
    started = time.perf_counter()
    with PretrainProgress(log_jsonl, console_jsonl, args.train_iters, console) as progress:
        run(cfg, Target(module="minitron.pretrain_gpt", argv=argv), monitor=progress.poll)
    for line in progress.summary(world, args.seq_length, time.perf_counter() - started, log_dir, log_jsonl):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


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
