"""``minitron estimate`` counts ZeRO-R's gathers (training/theoretical_zero_r.py): a traced
pretrain --deepspeed --deepspeed-activation-checkpointing run with rotary positions (so each
checkpoint gathers two inputs, the hidden states and the angle table) and 3 layers in checkpoints
of 2 (two checkpoints, the second of one layer) sends exactly the predicted tensor-parallel bytes,
rank by rank; the same prediction without ZeRO-R's term would be short by those gathers."""

from __future__ import annotations

import json

import pytest
import typer

from distributed import pretrain_records
from minitron.cli.estimate import check_trace

ARGV = ("--tensor-model-parallel-size 2 --num-layers 3 --hidden-size 32 --num-attention-heads 4 --seq-length 32 "
        "--micro-batch-size 1 --global-batch-size 2 --train-iters 1 --lr 1e-3 --mock-data --vocab-size 1023 "
        "--position-embedding-type rope --recompute-granularity full --recompute-method uniform "
        "--recompute-num-layers 2 --deepspeed --deepspeed-activation-checkpointing").split()


def test_the_estimate_predicts_the_gathers(tmp_path, monkeypatch):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
                                  "zero_optimization": {"stage": 1},
                                  "activation_checkpointing": {"partition_activations": True}}))
    trace = tmp_path / "trace"
    pretrain_records(tmp_path / "run", 2, [*ARGV, "--deepspeed-config", str(config)], trace_dir=trace)
    check_trace(trace, as_json=False)   # raises typer.Exit(1) on any difference

    from minitron.trace.reader import load_trace
    gathered = [c["args"]["shape"] for c in load_trace(trace)[0] if c["name"].endswith("all_gather_into_tensor")
                and c["args"].get("group") == "TENSOR_MODEL_PARALLEL_GROUP"]
    # 2 micro-batches x 2 checkpoints, each: half of [32, 1, 32] hidden, half of [32, 1, 1, 8] angles
    assert gathered == [[512], [128]] * 4
    # without ZeRO-R's term the estimate falls short of what the run sent
    monkeypatch.setattr("minitron.training.theoretical_comm.zero_r_gathers", lambda *a: None)
    with pytest.raises(typer.Exit):
        check_trace(trace, as_json=False)
