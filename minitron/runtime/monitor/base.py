"""The monitors' base class (DeepSpeed keeps it in monitor.py, which re-exports it from here).

Its own module because monitor.py's MonitorMaster imports every writer (csv_monitor.py,
tensorboard.py, wandb.py) and each writer subclasses this: with the base in monitor.py the
two sides would import each other.
"""

from __future__ import annotations


class Monitor:
    def __init__(self, section: dict):
        self.enabled = section["enabled"]

    def write_events(self, event_list: list) -> None:
        raise NotImplementedError
