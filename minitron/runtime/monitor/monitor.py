"""``deepspeed/monitor/monitor.py``: the monitors a run writes its scalars to.

An event is a TensorBoard-style triple ``(tag, value, step)``. DeepSpeed's engine counts the step
in samples (``global_samples``), not optimizer steps, so runs of different batch sizes line up on
one axis; its tags say so: ``Train/Samples/lr``, ``Train/Samples/loss_scale`` (fp16),
``Train/Samples/train_loss`` (the pipeline engine) and, with ``wall_clock_breakdown``,
``Train/Samples/elapsed_time_ms_{forward,backward,backward_inner,backward_allreduce,step}``.
Only global rank 0 builds a writer and writes.
"""

from __future__ import annotations

from minitron import comm as dist
from minitron.runtime.monitor.base import Monitor
from minitron.runtime.monitor.config import MonitorConfig
# Each writer imports its package (tensorboard, wandb) only when its section is enabled.
from minitron.runtime.monitor.csv_monitor import csvMonitor
from minitron.runtime.monitor.tensorboard import TensorBoardMonitor
from minitron.runtime.monitor.wandb import WandbMonitor


class MonitorMaster(Monitor):
    """Every enabled monitor, written to in turn (DeepSpeed's MonitorMaster)."""

    def __init__(self, config: MonitorConfig):
        self.enabled = config.enabled
        self.monitors = []
        if self.enabled and dist.get_rank() == 0:
            for kind, section in ((TensorBoardMonitor, config.tensorboard), (WandbMonitor, config.wandb),
                                  (csvMonitor, config.csv_monitor)):   # DeepSpeed's order
                if section["enabled"]:
                    self.monitors.append(kind(section))

    def write_events(self, event_list: list) -> None:
        if dist.get_rank() == 0:
            for monitor in self.monitors:
                monitor.write_events(event_list)
