"""ZeRO-R's activation checkpointing (runtime/activation_checkpointing/): one run of
docs/examples/zero_r_bytes.py on 2 gloo ranks forming one tensor-parallel group, every setting of
the ds_config section on the same 2-layer GPT with dropout on, traced; and the refusals of
--deepspeed-activation-checkpointing, before any rank starts.

Exact by construction: each checkpoint keeps its chunk's input, s x b x h fp32 numbers (32 x 2 x
32 x 4 bytes = 8 KiB), whole or one tensor-parallel half; the losses and gradients are bit-equal
to Megatron's checkpoint's (same arithmetic, same random draws replayed), so no tolerance.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from minitron.launcher import LaunchConfig, run_on_ranks, session_env
from minitron.runtime.activation_checkpointing import checkpointing
from minitron.training.argument_groups import ArgumentError, build_parser
from minitron.training.arguments import validate_args

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("zero_r_bytes", ROOT / "docs/examples/zero_r_bytes.py")
demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo)

CHUNK = demo.SEQ * demo.BATCH * 32 * 4   # one checkpoint's input, in bytes (hidden 32, fp32)
PARTITIONED = {"partition_activations", "partition + cpu", "partition + contiguous"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    trace = tmp_path_factory.mktemp("zero-r") / "trace"
    results = run_on_ranks(demo.measure, LaunchConfig(world_size=demo.TP, env=session_env(demo.TP, trace)))
    return results, trace


def test_every_setting_keeps_the_losses_and_gradients(run):
    results, _ = run
    for rank in results:
        losses = {row["loss"] for row in rank.values()}
        assert len(losses) == 1, rank
        assert all(row["same_grads"] for row in rank.values()), rank
    assert results[0] == results[1]   # the replicated input: both ranks keep as much


def test_partitioning_halves_what_the_checkpoints_keep(run):
    rows = run[0][0]
    for name, row in rows.items():
        kept = 2 * CHUNK // (demo.TP if name in PARTITIONED else 1)   # two checkpoints, one per layer
        assert row["kept"] == {"cpu": kept}, name
        # what the whole forward saved differs by exactly the checkpoints' difference
        assert row["saved"] - rows["Megatron's checkpoint"]["saved"] == kept - 2 * CHUNK, name
        assert row["gathers"] == (2 if name in PARTITIONED else 0), name   # one per checkpoint's backward


def test_the_gather_is_on_the_trace_over_the_tensor_parallel_group(run):
    from minitron.trace.reader import load_trace

    calls = load_trace(run[1])[1]   # rank 1's records
    gathers = [c for c in calls if c["name"].endswith("gather_partitioned_activations")]
    assert len(gathers) == 2 * len(PARTITIONED)
    assert gathers[0]["args"]["shapes"] == [[demo.SEQ, demo.BATCH, 32]]
    # through minitron.comm, as DeepSpeed's goes through deepspeed.comm; torch's call inside it
    children = [c for c in calls if c.get("parent") == gathers[0]["id"]]
    assert [c["name"] for c in children] == ["minitron.comm.comm.all_gather_into_tensor"]
    children = [c for c in calls if c.get("parent") == children[0]["id"]]
    assert [c["name"] for c in children] == ["torch.distributed.all_gather_into_tensor"]
    # each rank sends its half of the flattened input: 32 x 2 x 32 / 2 numbers
    assert children[0]["args"] == {"shape": [demo.SEQ * demo.BATCH * 32 // demo.TP], "dtype": "float32",
                                   "group": "TENSOR_MODEL_PARALLEL_GROUP", "ranks": [0, 1]}


MODEL = "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1"
FULL = "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"


def _validate(flags: str, section: dict | None, tmp_path) -> None:
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 1, **({"activation_checkpointing": section}
                                                            if section is not None else {})}))
    argv = f"{MODEL} --train-iters 2 --lr 1e-3 --mock-data --deepspeed --deepspeed-config {config} {flags}"
    args = build_parser().parse_args(argv.split())
    args.rank, args.world_size = 0, 1
    validate_args(args, {"tokenizer_type": "NullTokenizer", "vocab_size": 1024})


@pytest.mark.parametrize("flags, section, words", [
    (FULL, {"partition_activations": True}, "add the flag, or drop the section"),
    ("--deepspeed-activation-checkpointing", {}, "add --recompute-granularity full"),
    (f"--deepspeed-activation-checkpointing {FULL}", {"contiguous_memory_optimization": True},
     "requires partition_activations: true"),
    (f"--deepspeed-activation-checkpointing {FULL}", {"partition_activations": True, "number_checkpoints": 1,
                                                      "contiguous_memory_optimization": True}, "at least 2"),
    (f"--deepspeed-activation-checkpointing {FULL}", {"cpu_checkpointing": "yes"}, "must be true or false"),
])
def test_refused_in_one_line(flags, section, words, tmp_path):
    with pytest.raises(ArgumentError, match=words) as err:
        _validate(flags, section, tmp_path)
    assert "\n" not in str(err.value)


def test_accepted_with_the_flag(tmp_path):
    _validate(f"--deepspeed-activation-checkpointing {FULL}", {"partition_activations": True, "profile": True}, tmp_path)
    with pytest.raises(ArgumentError, match="only with --deepspeed"):
        args = build_parser().parse_args(f"{MODEL} --train-iters 2 --lr 1e-3 --mock-data "
                                         f"--deepspeed-activation-checkpointing {FULL}".split())
        args.rank, args.world_size = 0, 1
        validate_args(args, {"tokenizer_type": "NullTokenizer", "vocab_size": 1024})


def _in_process(section: dict, chunks: int) -> torch.Tensor:
    """``chunks`` checkpoints of a tanh in this process (tensor-parallel size 1: no group needed)."""
    checkpointing.configure(None, deepspeed_config={"activation_checkpointing": section})
    try:
        x = torch.linspace(-1, 1, 8, requires_grad=True)
        y = x
        for _ in range(chunks):
            y = checkpointing.checkpoint(torch.tanh, y)
        y.sum().backward()
        return x.grad
    finally:
        checkpointing.unconfigure()


def test_profile_prints_each_checkpoints_times(capsys):
    _in_process({"profile": True, "synchronize_checkpoint_boundary": True}, chunks=2)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["activation checkpoint forward"] * 2 + \
        ["activation checkpoint backward"] * 2


def test_contiguous_buffers_hold_number_checkpoints_and_no_more():
    section = {"partition_activations": True, "contiguous_memory_optimization": True, "number_checkpoints": 2}
    x = torch.linspace(-1, 1, 8)
    expected = 1 - torch.tanh(torch.tanh(x)) ** 2   # d/dx tanh(tanh(x)) = (1 - tanh(tanh x)^2)(1 - tanh(x)^2)
    # the closed form rounds otherwise than autograd's chain of two tanh backwards: 1e-6 relative
    assert torch.allclose(_in_process(section, chunks=2), expected * (1 - torch.tanh(x) ** 2), rtol=1e-6, atol=0)
    with pytest.raises(RuntimeError, match="more checkpoints in one forward than number_checkpoints"):
        _in_process(section, chunks=3)
