"""Print each stage's executed DeepSpeed instruction stream from a trace, one line per step.

    python docs/examples/ds_pipe_stream.py TRACE_DIR

TRACE_DIR is what `minitron pretrain --deepspeed --pipeline-model-parallel-size P --trace DIR`
wrote; the last training iteration's stream is shown, for data rank 0.
"""

from __future__ import annotations

import sys

from rich.console import Console

from minitron.cli.views.schedule_deepspeed import deepspeed_streams, render_stream
from minitron.trace.reader import load_trace


def main(trace_dir: str) -> int:
    console = Console(width=100, highlight=False)
    for stage, records in deepspeed_streams(load_trace(trace_dir)).items():
        console.print(f"stage {stage}:", style="bold")
        console.print(render_stream(records), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
