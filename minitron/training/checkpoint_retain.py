"""The last step of a save: move the latest-iteration marker, then (--save-retain-interval N)
remove the checkpoint it pointed at before, unless N divides that iteration, as Megatron's
iter_finalize_fn does. Rank 0 calls it once every file of the new checkpoint is in place, so a
run killed at any point still has a whole latest checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

from minitron.training.checkpoint_files import TRACKER, atomic_write_text, iteration_dir, read_latest_iteration


def write_tracker(save, iteration: int, retain_interval: int | None = None) -> Path | None:
    """Mark ``iteration`` the latest under ``save``; return the checkpoint removed, if any."""
    root = Path(save)
    previous = read_latest_iteration(root) if retain_interval else None
    atomic_write_text(str(iteration), root / TRACKER)
    if not previous or previous == iteration or previous % retain_interval == 0:
        return None
    old = iteration_dir(root, previous)
    if old.is_symlink() or not old.is_dir():   # as Megatron: a linked checkpoint is someone else's to keep
        return None
    shutil.rmtree(old)
    return old
