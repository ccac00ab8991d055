"""The journey of the notes, executed: the traced chain from the script's entry, Float16Module,
the parameter report, and the notes' claims that a run corrects (walkthrough chapters 1, 4, 6).

One real run (4 forked gloo ranks, pipeline 2 x data 2, bf16, one iteration of a tiny GPT) is
shared by the tests that read a trace; the rest are single-process checks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from minitron.core import parallel_state as mpu
from minitron.core.num_microbatches_calculator import _build_num_microbatches_calculator
from minitron.core.transformer.module import Float16Module, MegatronModule

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "examples"))

import journey  # noqa: E402  (docs/examples/journey.py: the chapters' demos)
import journey_launch  # noqa: E402  (docs/examples/journey_launch.py: appendix A's)

WORLD, PP, GBS, MBS = 4, 2, 8, 1  # so DP = 2 and each rank runs GBS / (MBS * DP) = 4 micro-batches
ARGV = ["--pipeline-model-parallel-size", str(PP), "--num-layers", "2", "--hidden-size", "16",
        "--num-attention-heads", "2", "--seq-length", "8", "--micro-batch-size", str(MBS),
        "--global-batch-size", str(GBS), "--train-iters", "1", "--mock-data", "--lr", "1e-3",
        "--bf16", "--eval-iters", "0"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """pretrain_gpt as every rank runs it, traced; {rank: records in call order}, {rank: log}."""
    from minitron.launcher import LaunchConfig, Target, launch, session_env

    tmp = tmp_path_factory.mktemp("journey")
    cfg = LaunchConfig(world_size=WORLD, env=session_env(WORLD, tmp / "trace"), log_dir=tmp / "logs")
    launch(cfg, Target(module="minitron.pretrain_gpt", argv=ARGV))
    records = {r: journey.load(tmp / "trace", r) for r in range(WORLD)}
    logs = {r: (tmp / "logs" / f"rank{r}.log").read_text() for r in range(WORLD)}
    return records, logs


CHAIN = ["pretrain_gpt.__main__", "pretrain", "initialize_megatron", "parse_args", "validate_args",
         "get_accelerator", "set_global_variables", "init_num_microbatches_calculator",
         "_build_num_microbatches_calculator", "_build_tokenizer", "build_tokenizer", "finish_mpu_init",
         "_initialize_distributed", "init_distributed", "init_process_group",
         "initialize_model_parallel", "_set_global_memory_buffer", "_set_random_seed", "setup_model_and_optimizer", "get_model",
         "model_provider"]


def test_the_chain_starts_at_the_entry_and_runs_in_megatrons_order(run):
    records, _ = run
    for rank, recs in records.items():
        assert journey.short(recs[0]["name"]) == "pretrain_gpt.__main__" and recs[0]["parent"] is None
        firsts = journey.first_calls(recs, CHAIN)
        assert [journey.short(r["name"]) for r in firsts] == CHAIN, f"rank {rank}"
        by_id = {r["id"]: r for r in recs}
        parent = {journey.short(r["name"]): journey.short(by_id[r["parent"]]["name"])
                  for r in firsts if r["parent"] is not None}
        assert parent["parse_args"] == parent["validate_args"] == parent["set_global_variables"] \
            == "initialize_megatron"
        assert parent["_build_num_microbatches_calculator"] == "init_num_microbatches_calculator"
        assert parent["build_tokenizer"] == "_build_tokenizer"
        imp = firsts[CHAIN.index("initialize_model_parallel")]["id"]
        assert journey.short([r for r in recs if r["parent"] == imp][-1]["name"]) == "_set_global_memory_buffer"
        calc = firsts[CHAIN.index("_build_num_microbatches_calculator")]["args"]
        assert (calc["global_batch_size"], calc["micro_batch_size"], calc["data_parallel_size"]) == (GBS, MBS, 2)


def test_model_provider_gets_its_stage_as_arguments(run):
    records, _ = run
    for rank, recs in records.items():
        calls = [r["args"] for r in recs if journey.short(r["name"]) == "model_provider"]
        first, last = rank < 2, rank >= 2  # pp rank is the slowest digit: ranks 0,1 stage 0
        assert calls == [{"pre_process": first, "post_process": last, "vp_stage": None,
                          "global_virtual_rank": None}]


def test_each_rank_runs_gbs_over_mbs_times_dp_micro_batches(run):
    records, _ = run
    for rank, recs in records.items():
        forwards = [r for r in recs if journey.short(r["name"]) == "forward_step"]
        assert len(forwards) == GBS // (MBS * WORLD // PP) == 4, f"rank {rank}"


def test_dp_with_cp_groups_are_created_before_dp(run):
    records, _ = run
    kinds = journey.group_kinds_in_order(records[0])
    assert kinds.index("DATA_PARALLEL_GROUP_WITH_CP") < kinds.index("DATA_PARALLEL_GROUP")


def test_parameter_report_counts_each_model_parallel_rank_once(run):
    _, logs = run
    lines = [line for log in logs.values() for line in log.splitlines() if "number of parameters" in line]
    # dp rank 0 speaks for its replicas: ranks 0 (tp 0, pp 0) and 2 (tp 0, pp 1)
    assert sorted(line.split("rank ")[1].split(":")[0] for line in lines) == ["(0, 0)", "(0, 1)"]
    assert all(int(line.rsplit(": ", 1)[1]) > 0 for line in lines)
    # the bf16 model (Float16Module around each chunk) trained: the last rank logged a finite loss
    loss = float(logs[WORLD - 1].split("lm loss: ")[1].split(" ")[0])
    assert 0 < loss < 100


class _Probe(MegatronModule):
    """Records the dtype of what it is given; returns it times a weight, or unchanged."""

    def __init__(self, config):
        super().__init__(config)
        self.weight = torch.nn.Parameter(torch.ones(3))
        self.register_buffer("steps", torch.zeros(1, dtype=torch.long))
        self.seen = []

    def forward(self, x, ids):
        self.seen.append((x.dtype, ids.dtype))
        return x * self.weight if x.dtype == self.weight.dtype else x


class _Config:
    def __init__(self, dtype):
        self.params_dtype = dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_float16_module_casts_the_model_inputs_and_outputs(monkeypatch, dtype):
    stage = {"first": True, "last": True}
    monkeypatch.setattr(mpu, "is_pipeline_first_stage", lambda **kw: stage["first"])
    monkeypatch.setattr(mpu, "is_pipeline_last_stage", lambda **kw: stage["last"])
    wrapped = Float16Module(_Config(dtype), _Probe(_Config(dtype)))
    probe = wrapped.module
    assert probe.weight.dtype == dtype and probe.steps.dtype == torch.long  # integers stay integers
    assert list(wrapped.state_dict()) == ["weight", "steps"]  # no "module." prefix in a checkpoint
    x, ids = torch.ones(3), torch.arange(3)

    out = wrapped(x, ids)  # a one-stage pipeline: cast in, compute in 16 bits, cast out
    assert probe.seen[-1] == (dtype, torch.long) and out.dtype == torch.float32

    stage.update(first=False, last=False)  # a middle stage: 16-bit activations pass as they are
    assert wrapped(x.to(dtype), ids).dtype == dtype
    assert wrapped(x, ids).dtype == torch.float32 and probe.seen[-1][0] == torch.float32  # not cast: not first

    stage.update(last=True)
    assert wrapped(x.to(dtype), ids, fp32_output=False).dtype == dtype


def test_float16_module_refuses_an_fp32_model():
    with pytest.raises(ValueError, match="--fp16 or --bf16"):
        Float16Module(_Config(torch.float32), _Probe(_Config(torch.float32)))


def test_seed_001_micro_batches_are_per_data_parallel_rank():
    # The notes' own numbers: GBS 16, MBS 2, DP 4. GBS / MBS = 8 counts the whole step's passes.
    calc = _build_num_microbatches_calculator(0, None, 16, 2, 4)
    assert calc.get() == 2 == 16 // (2 * 4) != 16 // 2


def test_seed_004_micro_batch_alone_sets_the_train_batch_not_the_accumulation():
    from minitron.runtime.config import resolve_batch_triad

    triad = resolve_batch_triad(None, 2, None, 4)
    assert tuple(triad) == (8, 2, 1)  # train_batch_size = micro x dp; one accumulation step


def test_seed_004_world_info_decodes_to_the_two_local_slots():
    from minitron.launcher.runner import decode_world_info, node_rank_env

    info = decode_world_info("eyJsb2NhbGhvc3QiOiBbMCwgMV19")
    assert info == {"localhost": [0, 1]}
    env = node_rank_env({"worker-0": [0, 1], "worker-1": [0, 1, 2, 3]}, 1, "worker-0", 29500)
    assert [e["LOCAL_RANK"] for e in env] == ["2", "3", "0", "1"]  # rank % local count, still


def test_tp_cp_group_holds_every_piece_of_one_micro_batch():
    lines = journey.tp_cp_lines(world=4, tp=2, cp=2)
    assert lines[0].startswith("tp-cp group [0, 1, 2, 3] (data-parallel rank 0)")
    assert "each once: the whole 16-token sequence" in lines[0]


def test_who_hosts_the_store_is_found_from_proc():
    import socket

    from minitron.launcher.launch import LaunchConfig, rank_env

    with socket.socket() as listener:  # this process listens: /proc must say so
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert journey_launch._listener_pid(listener.getsockname()[1]) == os.getpid()
    # minitron's ranks are told that an agent (the launcher's keeper) serves the store, not rank 0
    assert rank_env(0, LaunchConfig(world_size=2, master_port=1))["TORCHELASTIC_USE_AGENT_STORE"] == "True"
