"""What `minitron pretrain` shows while the ranks train, drawn by the launching process.

The ranks never write to our terminal: each one's stdout goes to its own log, so eight ranks
cannot fight over one screen. Two files bring the run to us instead, read each time the
launcher's monitor hook calls ``poll``:

    console.jsonl     the lines Megatron prints for the console (print_rank_0, print_rank_last,
                      the parameter counts), as the ranks printed them: shown as they come
    iterations.jsonl  one record per iteration from the rank holding the loss (--log-jsonl):
                      drives the progress bar and the closing summary

On a terminal a rich progress bar sits under the lines; anywhere else (a pipe, a CI log) there
are only the plain lines, with no cursor movement or colour codes in them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class JsonlTail:
    """The complete lines appended to a JSONL file since the last read."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for next time
        self._offset += len(complete)
        return [json.loads(line) for line in complete.decode().splitlines() if line.strip()]


class PretrainProgress:
    def __init__(self, log_jsonl: Path, console_jsonl: Path, train_iters: int, console: Console):
        self.iterations, self.lines = JsonlTail(log_jsonl), JsonlTail(console_jsonl)
        self.records: list[dict] = []
        self.console = console
        self.progress = None
        if console.is_terminal:
            self.progress = Progress(
                TextColumn("[bold]iteration"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), console=console)
            self.task = self.progress.add_task("train", total=train_iters, stats="starting ranks…")

    def __enter__(self):
        if self.progress:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.poll()
        if self.progress:
            return self.progress.__exit__(*exc)

    def poll(self) -> None:
        """Move the bar to the newest iteration, and show the new console lines above it."""
        self.records += self.iterations.read()
        for line in self.lines.read():
            if self.progress:
                self.progress.console.print(line["text"], markup=False, highlight=False)
            else:
                print(line["text"], file=sys.stdout, flush=True)
        if self.progress and self.records:
            r = self.records[-1]
            stats = f"lm loss {r['lm_loss']:.4f}  {r['tokens_per_s']:.0f} tokens/s"
            skipped = sum(x["skipped"] for x in self.records)
            if skipped:
                stats += f"  skipped {skipped}"
            self.progress.update(self.task, completed=r["iteration"], stats=stats)

    def summary(self, world: int, seq_length: int, seconds: float, log_dir: Path, log_jsonl: Path) -> list[str]:
        """The closing lines: how far the loss moved, how fast, and where the logs are."""
        done = self.records
        lines = [f"{len(done)} iteration{'s' if len(done) != 1 else ''} on {world} "
                 f"rank{'s' if world != 1 else ''} in {seconds:.1f} s"]
        losses = [r for r in done if r["lm_loss"] is not None]
        if losses:
            first, last = losses[0], losses[-1]
            lines.append(f"lm loss {first['lm_loss']:.4f} (iteration {first['iteration']}) -> "
                         f"{last['lm_loss']:.4f} (iteration {last['iteration']})")
        speed = speed_line(done, world, seq_length)
        if speed:
            lines.append(speed)
        ranks = "rank0.log" if world == 1 else f"rank{{0..{world - 1}}}.log"
        lines.append(f"logs: {log_dir}/{ranks} (one per rank), {log_jsonl} (one record per iteration)")
        return lines


def speed_line(records: list[dict], world: int, seq_length: int) -> str | None:
    """How fast the iterations ran: tokens/s, TFLOP/s/GPU and the time per iteration.

    The first iteration is left out when there are others: it pays the warm-up (the allocator
    growing, the first collectives setting up their connections, lazy imports), which the
    iterations of a long run do not, and a short run would otherwise be dominated by it.
    TFLOP/s/GPU is Megatron's --log-throughput figure over these iterations: the model's FLOPs
    (the records' ``flops``, theoretical_flops.py) over their time and the world size.
    """
    measured = records[1:] if len(records) > 1 else records
    seconds = sum(r["elapsed_ms"] for r in measured) / 1000.0
    if seconds <= 0:
        return None
    tokens = sum(r["global_batch_size"] for r in measured) * seq_length
    first, last = measured[0]["iteration"], measured[-1]["iteration"]
    which = f"iteration {first}" if first == last else f"iterations {first}-{last}"
    line = f"{which}: {tokens / seconds:.0f} tokens/s"
    if all("flops" in r for r in measured):   # records of an older minitron lack them
        tflops = sum(r["flops"] for r in measured) / (seconds * 10**12 * world)
        line += f", {tflops:.1f}" if tflops >= 1 else f", {tflops:.3g}"
        line += " TFLOP/s/GPU"
    line += f", {seconds * 1000.0 / len(measured):.1f} ms per iteration"
    if measured is records:
        return line + " (includes the warm-up: only one iteration ran)"
    return line + f" (iteration {records[0]['iteration']}, the warm-up, left out)"
