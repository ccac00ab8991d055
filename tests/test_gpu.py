"""On GPUs the same commands run real NCCL jobs (marked gpu; skipped, with the reason, where torch
sees fewer GPUs than a test needs).

Each test runs the `minitron` executable as a user would, one rank per GPU: pretrain (Megatron's
path, bf16), pretrain --deepspeed at ZeRO 0-3, trace --steps, a checkpoint saved on the GPU
resumed on CPU ranks, and, where several GPUs exist, the parallel layouts against one GPU's
losses. The CPU suite cannot run these; it holds the placement rules another way
(test_device_rule.py, test_device_step.py, test_device_ds.py, test_accelerator_backend.py).

bf16 tolerance: a layout changes the order of the bf16 sums (a tp all-reduce adds partial
products, a dp all-reduce adds per-replica gradients), so losses agree to bf16's relative
precision over a few iterations, not bit for bit: 2e-2 relative, about three bf16 ulps of a
loss near 7.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cli_here import run_minitron

GPUS = torch.cuda.device_count()
pytestmark = pytest.mark.gpu


def needs(n: int):
    return pytest.mark.skipif(GPUS < n, reason=f"needs {n} CUDA GPU{'s' if n > 1 else ''}, torch sees {GPUS}")


ITERS = 3
MODEL = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "256",
         "--max-position-embeddings", "256", "--micro-batch-size", "2", "--global-batch-size", "8",
         "--train-iters", str(ITERS), "--lr", "1e-4", "--mock-data", "--vocab-size", "1023",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7"]


def pretrain(out: Path, world: int, *flags, backend: str = "nccl") -> list[dict]:
    done = run_minitron("pretrain", "--world", world, "--backend", backend, "--log-dir", out, *MODEL, *flags,
                        timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in open(out / "iterations.jsonl")]


def losses(records):
    return [r["lm_loss"] for r in records]


@needs(1)
def test_one_gpu_trains_in_bf16_and_says_how_fast(tmp_path):
    done = run_minitron("pretrain", "--world", 1, "--backend", "nccl", "--log-dir", tmp_path, *MODEL, "--bf16",
                        "--log-throughput", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in open(tmp_path / "iterations.jsonl")]
    assert len(records) == ITERS and all(r["lm_loss"] == r["lm_loss"] for r in records)  # no nan
    logs = (tmp_path / "rank0.log").read_text()
    assert "throughput per GPU (TFLOP/s/GPU)" in logs and "max allocated" in logs


@needs(1)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deepspeed_engine_on_one_gpu(tmp_path, stage):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
                                  "gradient_clipping": 1.0, "bf16": {"enabled": True},
                                  "zero_optimization": {"stage": stage}}))
    records = pretrain(tmp_path / "run", 1, "--bf16", "--deepspeed", "--deepspeed-config", config)
    assert len(records) == ITERS and losses(records)[-1] < losses(records)[0] + 0.5


@needs(1)
def test_trace_steps_on_a_gpu(tmp_path):
    done = run_minitron("trace", "--world", 1, "--backend", "nccl", "--steps", 1, "--out", tmp_path / "t",
                        timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@needs(1)
def test_gloo_ranks_on_a_gpu_machine_stay_on_the_cpu(tmp_path):
    """More ranks than GPUs, and fake ranks: CPU ranks, as on a laptop without a GPU."""
    for backend in ("gloo", "fake"):
        done = run_minitron("trace", "--world", 4, "--tp", 2, "--backend", backend, "--out", tmp_path / backend,
                            timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@needs(1)
@pytest.mark.parametrize("fmt", ["torch_dist", "torch"])
def test_a_gpu_checkpoint_resumes_on_cpu_ranks(tmp_path, fmt):
    """Saved by a GPU rank after 2 iterations, resumed by a gloo rank for the third: the same
    third loss as the GPU run's own third (fp32, to a CPU-vs-GPU kernel tolerance)."""
    flags = ["--ckpt-format", fmt, "--use-distributed-optimizer", "--use-cpu-initialization"]
    whole = pretrain(tmp_path / "whole", 1, *flags)
    pretrain(tmp_path / "a", 1, *flags, "--exit-interval", "2", "--save", tmp_path / "ckpt")
    rest = pretrain(tmp_path / "b", 1, *flags, "--load", tmp_path / "ckpt", backend="gloo")
    assert losses(rest) == pytest.approx(losses(whole)[2:], rel=1e-4)


LAYOUTS = {  # name: (GPUs, flags)
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "dp2": (2, []),
    "tp2-pp2": (4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
    "tp2-dp2-distopt": (4, ["--tensor-model-parallel-size", "2", "--use-distributed-optimizer"]),
}


@pytest.fixture(scope="module")
def serial_bf16(tmp_path_factory):
    if GPUS < 2:
        pytest.skip(f"the layouts need 2 or more CUDA GPUs, torch sees {GPUS}")
    return losses(pretrain(tmp_path_factory.mktemp("serial"), 1, "--bf16", "--use-cpu-initialization"))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layouts_on_several_gpus_match_one(tmp_path, serial_bf16, name):
    """--use-cpu-initialization: every layout starts from the serial run's weights, as in Megatron
    (drawn on the GPU, tensor-parallel slices come from each rank's own stream)."""
    gpus, flags = LAYOUTS[name]
    if GPUS < gpus:
        pytest.skip(f"{name} needs {gpus} CUDA GPUs, torch sees {GPUS}")
    got = losses(pretrain(tmp_path, gpus, "--bf16", "--use-cpu-initialization", *flags))
    assert got == pytest.approx(serial_bf16, rel=2e-2), f"{name}: {got} vs one GPU {serial_bf16}"
