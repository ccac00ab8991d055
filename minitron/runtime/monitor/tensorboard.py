"""``deepspeed/monitor/tensorboard.py``: torch's SummaryWriter in ``output_path/job_name/``, one
``add_scalar(tag, value, step)`` per event, flushed after each batch of events so a TensorBoard
watching the directory sees a step as soon as it is written. Needs the ``tensorboard`` package
(config.py refuses the section before the run when it is missing)."""

from __future__ import annotations

import os

from minitron.runtime.monitor.base import Monitor


class TensorBoardMonitor(Monitor):
    def __init__(self, section: dict):
        super().__init__(section)
        # lazy: torch.utils.tensorboard imports the tensorboard package, needed only here
        from torch.utils.tensorboard import SummaryWriter
        log_dir = os.path.join(section["output_path"], section["job_name"])
        os.makedirs(log_dir, exist_ok=True)
        self.summary_writer = SummaryWriter(log_dir=log_dir)

    def write_events(self, event_list: list, flush: bool = True) -> None:
        for event in event_list:
            self.summary_writer.add_scalar(*event)
        if flush:
            self.summary_writer.flush()
