"""``deepspeed/monitor/wandb.py``: ``wandb.init(project, group, entity=team)`` once, then one
``wandb.log({tag: value}, step=step)`` per event. Where the run goes is wandb's own business:
``WANDB_MODE=offline`` keeps it in ./wandb on this machine (the way to use it with no account).
Needs the ``wandb`` package (config.py refuses the section before the run when it is missing)."""

from __future__ import annotations

from minitron.runtime.monitor.base import Monitor


class WandbMonitor(Monitor):
    def __init__(self, section: dict):
        super().__init__(section)
        try:
            import wandb   # lazy: an optional package, needed only when this section is enabled
        except ImportError:
            raise ImportError("wandb.enabled needs the optional 'wandb' package (pip install wandb); "
                              "or set it to false") from None
        self.wandb = wandb
        wandb.init(project=section["project"], group=section["group"], entity=section["team"])

    def write_events(self, event_list: list) -> None:
        for tag, value, step in event_list:
            self.wandb.log({tag: value}, step=step)
