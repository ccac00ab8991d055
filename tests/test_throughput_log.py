"""The numbers Megatron prints about speed: --log-throughput's TFLOP/s/GPU (and MFU where the
device's peak is known), the memory line on a GPU, `pretrain`'s closing speed without the
warm-up, timers that wait for the device, and traces that say which clock they read.

One real run (2 gloo ranks, data parallel, 3 iterations) checks the line and the records; the
rest are unit tests with stand-ins for a GPU, which this machine does not have.
"""

from __future__ import annotations

import json
import os
import re
from argparse import Namespace

import pytest

from cli_here import run_minitron
from deadline import deadline

from minitron.training.theoretical_flops import num_floating_point_operations, peak_tflops_of

THROUGHPUT = "throughput per GPU (TFLOP/s/GPU)"
# The tiny model of the run, as theoretical_flops reads it (NullTokenizer: 1024 + 1 tokens,
# padded to a multiple of 128 at tp 1).
MODEL = dict(num_layers=1, hidden_size=32, num_attention_heads=4, kv_channels=8, ffn_hidden_size=128,
             seq_length=16, padded_vocab_size=1152, swiglu=False, group_query_attention=False,
             num_query_groups=None, num_experts=None, multi_latent_attention=False)
ARGV = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "2",
        "--train-iters", "3", "--log-interval", "1", "--lr", "1e-3", "--mock-data", "--log-throughput"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    logs = tmp_path_factory.mktemp("throughput") / "logs"
    # In this process (its ranks forked from it, torch already imported): the ranks write only to
    # their logs, and everything `pretrain` prints comes from this process.
    with deadline(300):
        done = run_minitron("pretrain", "--world", "2", *ARGV, "--log-dir", str(logs), env=dict(os.environ),
                            here=True)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in open(logs / "iterations.jsonl")]
    return records, (logs / "rank1.log").read_text()


def _fields(line: str) -> dict[str, str]:
    parts = [p.strip() for p in line.split("|") if p.strip()]
    return dict(p.rsplit(": ", 1) for p in parts[1:])


def test_records_carry_megatrons_flop_count_and_throughput(run):
    records, _ = run
    expected = num_floating_point_operations(Namespace(**MODEL), 2)
    assert expected == 9535488   # counted by hand: MLP, attention, logits GEMMs x 2 (FMA) x 3 (fwd+bwd)
    for r in records:
        # The count is integer arithmetic in floats (exact below 2**53): equal, within 1e-12.
        assert r["flops"] == pytest.approx(expected, rel=1e-12)
        seconds = r["elapsed_ms"] / 1000
        assert r["throughput_tflops_per_gpu"] == pytest.approx(r["flops"] / (seconds * 1e12 * 2), rel=1e-9)
        assert "mfu" not in r   # the CPU has no known peak


def test_iteration_line_has_throughput_after_the_time_and_no_mfu_on_cpu(run):
    records, log = run
    lines = [line for line in log.splitlines() if re.match(r" \[[\d\- :]+\] iteration ", line)]
    assert len(lines) == 3
    for line, record in zip(lines, records):
        keys = list(_fields(line))
        assert keys[keys.index("elapsed time per iteration (ms)") + 1] == THROUGHPUT   # Megatron's place
        assert float(_fields(line)[THROUGHPUT]) == float(f"{record['throughput_tflops_per_gpu']:.1f}")
        assert not any(key.startswith("MFU") for key in keys)
    assert "memory (MB)" not in log   # the memory line is a GPU's


class _Optimizer:
    param_groups = [{"lr": 1e-3}]

    def get_loss_scale(self):
        return 1.0


def test_mfu_and_memory_reports_on_a_gpu_with_a_known_peak(monkeypatch, tmp_path, capsys):
    """A stand-in CUDA device named as an H100 SXM reports: MFU against 989 TFLOP/s, and the
    memory line at the logged iterations up to the first one past iteration 1."""
    import torch
    from minitron.training import training_log

    monkeypatch.setattr(training_log, "get_accelerator", lambda: Namespace(current_device_name=lambda: "cuda:0"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(training_log, "is_last_rank", lambda: True)
    monkeypatch.setattr(training_log, "get_num_microbatches", lambda: 1)
    reports = []
    monkeypatch.setattr(training_log, "report_memory", reports.append)
    args = Namespace(**MODEL, log_jsonl=str(tmp_path / "it.jsonl"), log_interval=1, iteration=0, world_size=2,
                     train_iters=3, consumed_train_samples=0, log_throughput=True)
    log = training_log.IterationLog(args)
    for iteration in (1, 2, 3):
        log.iteration(iteration, {"lm loss": 7.0}, 0, 1.0, None, _Optimizer(), 2, 0.004)
    log.close()
    record = json.loads(open(args.log_jsonl).readline())
    tflops = 9535488 / (0.004 * 1e12 * 2)
    assert record["throughput_tflops_per_gpu"] == pytest.approx(tflops, rel=1e-9)
    assert record["mfu"] == pytest.approx(tflops / 989.0, rel=1e-9)
    line = capsys.readouterr().out.splitlines()[0]
    assert float(_fields(line)["MFU (%)"]) == float(f"{100 * tflops / 989.0:.1f}")
    assert reports == ["(after 1 iterations)", "(after 2 iterations)"]


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-40GB", 312.0),
    ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0), ("Tesla V100-SXM2-16GB", None), ("cpu", None)])
def test_peak_by_device_name(name, peak):
    assert peak_tflops_of(name) == peak


def _record(iteration: int, ms: float, flops: float = 1e12) -> dict:
    return {"iteration": iteration, "elapsed_ms": ms, "global_batch_size": 4, "flops": flops}


def test_summary_leaves_out_the_first_iteration():
    from minitron.cli.progress import speed_line

    records = [_record(1, 5000.0)] + [_record(i, 500.0) for i in range(2, 6)]   # a slow warm-up
    line = speed_line(records, world=2, seq_length=8)
    # Iterations 2-5: 4 x 4 x 8 = 128 tokens in 2 s; 4e12 FLOPs / (2 s x 2 ranks) = 1 TFLOP/s/GPU.
    assert line == ("iterations 2-5: 64 tokens/s, 1.0 TFLOP/s/GPU, 500.0 ms per iteration "
                    "(iteration 1, the warm-up, left out)")


def test_summary_of_one_iteration_says_it_includes_the_warm_up():
    from minitron.cli.progress import speed_line

    line = speed_line([_record(7, 2000.0, flops=2e9)], world=1, seq_length=8)
    assert line == "iteration 7: 16 tokens/s, 0.001 TFLOP/s/GPU, 2000.0 ms per iteration " \
                   "(includes the warm-up: only one iteration ran)"


def test_timers_wait_for_the_device(monkeypatch):
    from minitron.core import timers as timers_module

    calls = []
    monkeypatch.setattr(timers_module, "get_accelerator", lambda: Namespace(synchronize=lambda: calls.append(1)))
    timer = timers_module.Timers()("step")
    timer.start()
    assert len(calls) == 1
    timer.stop()
    assert len(calls) == 2
    timer.elapsed()   # a stopped timer reads its sum: nothing to wait for
    assert len(calls) == 2


def test_a_synchronized_trace_says_gpu_time(tmp_path, monkeypatch):
    from minitron.cli.views.perfetto import to_chrome
    from minitron.trace import recorder
    from minitron.trace.reader import clock_of, load_trace
    from minitron.trace.schema import CLOCK, GPU_TIME, HOST_TIME

    @recorder.traced(name="step")
    def step():
        waits.append("work")

    waits = []
    monkeypatch.setattr(recorder, "_DEVICE_SYNC", None)
    for name, sync in (("host", None), ("gpu", lambda: waits.append("sync"))):
        recorder.start(tmp_path / name, 0)
        recorder.set_device_sync(sync)   # the accelerator chose its device after recording began
        step()
        recorder.set_device_sync(None)
        recorder.stop()
    assert waits == ["work", "sync", "work", "sync"]   # the GPU's call waited at its start and end
    host, gpu = load_trace(tmp_path / "host"), load_trace(tmp_path / "gpu")
    assert [r["name"] for r in host[0]] == ["step"]
    assert [r["name"] for r in gpu[0]] == [CLOCK, "step"]
    assert (clock_of(host), clock_of(gpu)) == (HOST_TIME, GPU_TIME)
    assert to_chrome(gpu)["otherData"] == {"clock": GPU_TIME}
    assert to_chrome(host, note="n")["otherData"] == {"clock": HOST_TIME, "note": "n"}
