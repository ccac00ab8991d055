"""DeepSpeed's five lr schedules, each read from a ds_config's scheduler section: chapter 14 runs this.

    python docs/examples/lr_schedules_demo.py     # the lr each optimizer step runs at

Each schedule is parsed as the engine parses it (runtime/config_sections.parse_scheduler, with
DeepSpeed's defaults filled in) and built on a torch AdamW whose own lr is 0.01 (WarmupLR without
warmup_max_lr, and WarmupCosineLR, take the group's lr as their top). Step n runs at the lr the
schedule set after step n - 1, the first at the one set at construction (t = -1).
"""

from __future__ import annotations

import torch

from minitron.runtime.config_sections import parse_scheduler
from minitron.runtime.lr_schedules import SCHEDULERS

STEPS = 24
SECTIONS = [
    {"type": "WarmupLR", "params": {"warmup_num_steps": 8, "warmup_type": "linear"}},
    {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 8, "warmup_type": "linear",
                                         "total_num_steps": 20}},
    {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 8, "warmup_type": "linear", "total_num_steps": 20}},
    {"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_first_step_size": 8,
                                    "decay_step_size": 2, "decay_lr_rate": 0.5}},
    {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.001, "lr_range_test_step_size": 4,
                                       "lr_range_test_staircase": True}},
]


def lrs(section: dict) -> tuple[list, list]:
    kind, params = parse_scheduler({"scheduler": section})
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.01)
    schedule = SCHEDULERS[kind](optimizer, **params)
    out, betas = [], []
    for _ in range(STEPS):
        out.append(optimizer.param_groups[0]["lr"])
        betas.append(optimizer.param_groups[0]["betas"][0])
        schedule.step()    # the engine's call after each applied optimizer step
    return out, betas


def main() -> None:
    print(f"{'step':>15}" + "".join(f"{n:>6}" for n in range(1, STEPS + 1, 2)))
    for section in SECTIONS:
        values, betas = lrs(section)
        print(f"{section['type']:>15}" + "".join(f"{v * 1000:6.2f}" for v in values[::2]))
        if section["type"] == "OneCycle":
            print(f"{'(beta1)':>15}" + "".join(f"{b:6.3f}" for b in betas[::2]))
    print("lr in units of 1e-3, every second step; OneCycle's momentum (Adam's beta1) moves against its lr")


if __name__ == "__main__":
    main()
