"""`minitron estimate` with a ds_config that offloads: the host's share of each rank's bytes and
what crosses between host and device in one train_step (training/theoretical_offload.py). The
memory table above it counts the device only."""

from __future__ import annotations

from minitron.cli.common import console
from minitron.cli.views.fitted_table import print_fitted
from minitron.cli.views.words import human, rank_ranges


def offload_rows(args, costs) -> list[tuple[list[int], dict]]:
    """(ranks, offload costs) for each pipeline stage: a stage's ranks hold equal partitions."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.training.theoretical_memory_usage import stage_buffers
    from minitron.training.theoretical_offload import offload_costs

    by_stage: dict[int, tuple[list[int], dict]] = {}
    for c in costs:
        pp = c.role[0]
        if pp not in by_stage:
            by_stage[pp] = ([], offload_costs(args, stage_buffers(args, pp)[0][0]))
        by_stage[pp][0].append(c.rank)
    return list(by_stage.values())


def render_offload(args, costs) -> None:
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.training.theoretical_offload import KEYS

    rows = offload_rows(args, costs)
    keys = [k for k in KEYS if any(r[k] for _, r in rows)]
    print_fitted(console, "ZeRO-Offload, one train_step",
                 ["ranks", *keys], [[rank_ranges(ranks), *[human(r[k]) for k in keys]] for ranks, r in rows])
