"""``deepspeed/monitor/csv_monitor.py``: one CSV file per tag, under ``output_path/job_name/``.

A tag's slashes become underscores in the file's name (``Train/Samples/lr`` ->
``Train_Samples_lr.csv``), and its last part names the value's column: ``step,lr``. The header
is written the first time this run writes a tag, and rows are appended, so a second run into the
same directory adds a second header where it starts (as DeepSpeed's does).
"""

from __future__ import annotations

import csv
import os

from minitron.runtime.monitor.base import Monitor


class csvMonitor(Monitor):   # DeepSpeed's spelling
    def __init__(self, section: dict):
        super().__init__(section)
        self.filenames: list = []
        self.log_dir = os.path.join(section["output_path"], section["job_name"])
        os.makedirs(self.log_dir, exist_ok=True)

    def write_events(self, event_list: list) -> None:
        for tag, value, step in event_list:
            filename = tag.replace("/", "_").replace(" ", "_")
            with open(os.path.join(self.log_dir, filename + ".csv"), "a+", newline="") as file:
                writer = csv.writer(file)
                if filename not in self.filenames:
                    self.filenames.append(filename)
                    writer.writerow(["step", tag.split("/")[-1]])
                writer.writerow([step, value])
