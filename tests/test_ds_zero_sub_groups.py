"""Stage 3's sub_group_size and ZeRO-Infinity's pipelined swapping as DeepSpeed 0.19.8 runs them,
on 2 forked gloo ranks (one launch, two Adam steps of a two-linear net whose weights are 1 MiB a
rank in fp32, the least DeepSpeed swaps).

* sub_group_size cuts the parameters into sub-groups, each its own fp32 master, stepped one after
  another: the numbers are the one-group run's, bit for bit, and the checkpoint's fp32_flat_groups
  holds one flat per sub-group, as DeepSpeed's does; made universal, it loads into one group.
* With offload_optimizer nvme each sub-group of 1 MiB or more has its own swap files; the small
  one stays in host memory.
* pipeline_read/pipeline_write move the same bytes with the same numbers; the trace shows each
  read started ahead and each write left in flight, and too few buffers stop the step by name.
"""
import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from distributed import run_ranks
from minitron.runtime.checkpoint.ds_to_universal import main as ds_to_universal
from minitron.trace.reader import load_trace

WORLD, IN, OUT = 2, 512, 1024   # each weight: 524,288 elements, 262,144 (1 MiB of fp32) a rank
RUN, STEPS = "sub_groups.run", 2
PLAIN = {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0,
         "stage3_max_reuse_distance": 0}
SUB = {**PLAIN, "sub_group_size": 262_144}   # [up.weight], [up.bias, down.weight], [down.bias]
NVME = {"device": "nvme", "nvme_path": "NVME"}
CASES = {
    "whole": PLAIN,
    "sub": SUB,
    "nvme": {**SUB, "offload_optimizer": NVME},
    "pipelined": {**SUB, "offload_optimizer": {**NVME, "pipeline_read": True, "pipeline_write": True,
                                               "buffer_count": 9}},
    # the first step's read-ahead: sub-group 0's master and sub-group 1's, one buffer each
    "few_buffers": {**SUB, "offload_optimizer": {**NVME, "pipeline_read": True, "buffer_count": 1}},
}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = torch.nn.Linear(IN, OUT), torch.nn.Linear(OUT, IN)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


def _runs(rank: int, root: str) -> dict:
    from minitron.runtime import initialize
    from minitron.runtime.checkpoint.pickles import load_state
    from minitron.trace import traced
    out = {}
    for name, zero in CASES.items():
        @traced(name=RUN, args=lambda name=name: {"case": name})
        def run():
            config = {"train_batch_size": 2 * WORLD, "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
                      "zero_optimization": json.loads(json.dumps(zero).replace("NVME", f"{root}/{name}"))}
            engine, losses = initialize(model=Net(), config=config)[0], []
            for k in range(STEPS):
                g = torch.Generator().manual_seed(10 * k + rank)
                loss = engine(torch.randn(2, IN, generator=g)).pow(2).mean()
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
            opt = engine.optimizer
            result = {"losses": losses, "groups": [len(g) for g in opt.fp16_groups],
                      "files": opt.swapper.files() if opt.swapper else []}
            if not opt.swapper:   # the states are in memory: the master as a whole, and its checkpoint form
                engine.save_checkpoint(f"{root}/ckpt-{name}")
                result["master"] = torch.cat([m.detach() for m in opt.single_partition_of_fp32_groups])
                mine = next(Path(root).glob(f"ckpt-{name}/*/*rank_{rank}_*optim_states.pt"))
                result["flats"] = len(load_state(mine)["optimizer_state_dict"]["fp32_flat_groups"])
            return result
        try:
            out[name] = run()
        except RuntimeError as err:
            out[name] = str(err)
    # the sub-groups' checkpoint made universal, loaded into one group: the same masters
    if rank == 0:
        with contextlib.redirect_stdout(io.StringIO()):
            ds_to_universal(["--input_folder", next(Path(root).glob("ckpt-sub/global_step*")).as_posix(),
                             "--output_folder", f"{root}/universal/global_step{STEPS}"])
    torch.distributed.barrier()
    config = {"train_batch_size": 2 * WORLD, "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
              "zero_optimization": PLAIN, "checkpoint": {"load_universal": True}}
    engine = initialize(model=Net(), config=config)[0]
    engine.load_checkpoint(f"{root}/universal")
    out["universal"] = engine.optimizer.single_partition_of_fp32_groups[0].detach().clone()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sub_groups")
    results = run_ranks(lambda rank: _runs(rank, str(root)), world_size=WORLD, tp=None, trace_dir=str(root / "trace"))
    return results, load_trace(root / "trace")


def test_sub_groups_step_the_same_numbers(runs):
    for rank in runs[0]:
        whole, sub = rank["whole"], rank["sub"]
        assert whole["groups"] == [4] and sub["groups"] == [1, 2, 1]
        assert sub["losses"] == whole["losses"]
        assert torch.equal(sub["master"], whole["master"])
        assert (whole["flats"], sub["flats"]) == (1, 3)   # fp32_flat_groups: one per sub-group
        assert torch.equal(rank["universal"], whole["master"])   # converted, then loaded into one group


def test_each_large_sub_group_has_its_swap_files(runs):
    for rank in runs[0]:
        # Offloaded, the config's Adam is CPU-Adam (float32 bias corrections, fmas): measured
        # 1e-7 relative apart from FusedAdam's after the first step; 1e-6 is ten times that.
        assert rank["nvme"]["losses"] == pytest.approx(rank["sub"]["losses"], rel=1e-6)
        # sub-groups named by their first and last parameters' ds_ids (0 up.weight ... 3 down.bias);
        # down.bias's sub-group (256 elements a rank) stays in memory
        assert rank["nvme"]["files"] == ["0_0.tensor.swp", "1_2.tensor.swp", "exp_avg-0_0.tensor.swp",
                                         "exp_avg-1_2.tensor.swp", "exp_avg_sq-0_0.tensor.swp",
                                         "exp_avg_sq-1_2.tensor.swp"]


def _calls(records: list, case: str, name: str) -> list:
    run = next(r for r in records if r["name"] == RUN and r["args"]["case"] == case)
    return [r["args"] for r in records if run["start_us"] <= r["start_us"] and r["end_us"] <= run["end_us"]
            and r["name"].endswith(name)]


def test_pipelining_reads_ahead_and_writes_behind(runs):
    for rank in runs[0]:
        assert rank["pipelined"]["losses"] == rank["nvme"]["losses"]
        assert rank["pipelined"]["files"] == rank["nvme"]["files"]
        assert "buffer_count 1: pipelined swapping holds 2 buffers" in rank["few_buffers"]
    for records in runs[1].values():
        # per step: sub-group 1 read ahead while 0 steps; 0 written while 1 is read and stepped
        assert [a["group"] for a in _calls(records, "pipelined", "start_swap_in")] == [1] * STEPS
        outs = _calls(records, "pipelined", ".swap_out_optimizer_state")
        assert [(a["group"], a["async"]) for a in outs][-4:] == [(0, True), (1, False)] * 2
        assert [a["group"] for a in _calls(records, "pipelined", "complete_swap_out")] == [0] * STEPS
        assert _calls(records, "nvme", "start_swap_in") == []
