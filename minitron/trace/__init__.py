"""Call tracing: ``@traced`` steps and wrapped torch.distributed calls, one JSON line per call.

Turn it on for a process with ``start(out_dir, rank)``, or by setting ``MINITRON_TRACE_DIR``
before a rank starts (that is how ``minitron trace`` and torchrun runs switch it on). The views
of a trace (call tree, groups, checks, schedule) live with the command line, not here: this
package is the ground floor, and it only records.
"""

from __future__ import annotations

import os

from minitron.trace import recorder
from minitron.trace.recorder import Recorder, active, traced

TRACE_DIR_ENV = "MINITRON_TRACE_DIR"

__all__ = ["traced", "start", "stop", "active", "TRACE_DIR_ENV"]


def start(out_dir: str | os.PathLike, rank: int, keep: bool = False) -> Recorder:
    """Record this process as ``rank``: its @traced steps and its torch.distributed calls
    (``keep``: also in the recorder's ``records``, see Recorder)."""
    # Imported here, not at the top: every module with a @traced step imports this package,
    # the torch-free command line among them, and torch_hooks loads torch.distributed.
    from minitron.trace import torch_hooks

    started = recorder.start(out_dir, rank, keep)
    torch_hooks.install()
    return started


def stop() -> None:
    """Flush the trace; torch.distributed gets its own functions back."""
    from minitron.trace import torch_hooks  # see start()

    recorder.stop()
    torch_hooks.uninstall()
