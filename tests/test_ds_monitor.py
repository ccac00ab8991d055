"""The engine's monitors (runtime/monitor/): the ds_config's tensorboard, csv_monitor and wandb
sections read as DeepSpeed 0.19.8 reads them, a missing package refused in one line before any
rank starts, and what a run on two forked gloo ranks writes: DeepSpeed's tags at
``global_samples``, from rank 0 only, and with ``wall_clock_breakdown`` its two timer lines.
test_ds_monitor_peer.py holds the files and the lines against DeepSpeed's own engine.
"""

import contextlib
import csv
import importlib.util
import io
import re

import pytest

from distributed import run_ranks
from minitron.runtime.config import DeepSpeedConfig
from minitron.runtime.config_values import DeepSpeedConfigError
from test_ds_checkpoint import TiedNet, train

HAS = {name: importlib.util.find_spec(name) is not None for name in ("tensorboard", "wandb")}
MICRO = ("fwd_microstep", "bwd_microstep", "bwd_inner_microstep", "bwd_allreduce_microstep", "step_microstep")
GLOBAL = ("fwd", "bwd", "bwd_inner", "bwd_allreduce", "step")
TIMED = ("forward", "backward", "backward_inner", "backward_allreduce", "step")


def test_sections_default_as_deepspeeds():
    monitor = DeepSpeedConfig({"train_batch_size": 2, "csv_monitor": {"enabled": "yes", "job_name": "run"}},
                              world_size=1).monitor_config
    assert monitor.enabled and monitor.csv_monitor == {"enabled": True, "output_path": "", "job_name": "run"}
    assert monitor.tensorboard == {"enabled": False, "output_path": "", "job_name": "DeepSpeedJobName"}
    assert monitor.wandb == {"enabled": False, "group": None, "team": None, "project": "deepspeed"}


@pytest.mark.parametrize("section", [name for name, there in HAS.items() if not there])
def test_a_missing_package_is_refused_before_the_run(section):
    with pytest.raises(DeepSpeedConfigError, match=f"needs the '{section}' package.*pip install {section}"):
        DeepSpeedConfig({"train_batch_size": 2, section: {"enabled": True}}, world_size=1)


@pytest.mark.parametrize("config, words", [
    ({"csv_monitor": {"enabled": True, "path": "x"}}, "unknown key 'path'"),
    ({"csv_monitor": {"enabled": True, "job_name": 7}}, "csv_monitor.job_name must be a string"),
    ({"tensorboard": True}, "tensorboard must be an object"),
    ({"comet": {"enabled": True}}, "Comet monitor is not built"),
    ({"wall_clock_breakdown": "yes"}, "wall_clock_breakdown must be true or false"),
])
def test_refused_in_one_line(config, words):
    with pytest.raises(DeepSpeedConfigError) as refused:
        DeepSpeedConfig({"train_batch_size": 2, **config}, world_size=1)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def monitored(root: str, precision: str = "fp32", **sections) -> dict:
    config = {"train_batch_size": 8, "gradient_accumulation_steps": 2, "wall_clock_breakdown": True,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.01, "warmup_num_steps": 4,
                                                           "warmup_type": "linear"}},
              "csv_monitor": {"enabled": True, "output_path": root, "job_name": "job"}, **sections}
    if precision != "fp32":   # (a scale that does not overflow here: every step is taken)
        config[precision] = {"enabled": True, **({"initial_scale_power": 8} if precision == "fp16" else {})}
    return config


def _run(root: str, precision: str = "fp32", **sections):
    def body(rank):
        from minitron.runtime import initialize
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            engine, *_ = initialize(model=TiedNet(), config=monitored(f"{root}/rank{rank}", precision, **sections))
            train(engine, rank, precision, range(4))   # 4 micro-steps: 2 optimizer steps
        return printed.getvalue()
    return body


def read_csvs(job_dir) -> dict:
    return {path.name: list(csv.reader(open(path, newline=""))) for path in sorted(job_dir.iterdir())}


@pytest.fixture(scope="module")
def fp16_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("monitor")
    return root, run_ranks(_run(str(root), "fp16"), world_size=2, tp=None)


def test_rank0_writes_deepspeeds_tags_at_global_samples(fp16_run):
    root, _ = fp16_run
    assert not (root / "rank1").exists()   # only rank 0 builds a writer
    files = read_csvs(root / "rank0" / "job")
    assert sorted(files) == sorted(["Train_Samples_lr.csv", "Train_Samples_loss_scale.csv"]
                                   + [f"Train_Samples_elapsed_time_ms_{t}.csv" for t in TIMED])
    # the lr after each step: a linear warm-up from 0.01 to the group's 0.1 over 4 steps, at t = 0, 1
    assert files["Train_Samples_lr.csv"] == [["step", "lr"], ["8", "0.01"], ["16", "0.0325"]]
    assert files["Train_Samples_loss_scale.csv"] == [["step", "loss_scale"], ["8", "256.0"], ["16", "256.0"]]
    for tag in TIMED:
        rows = files[f"Train_Samples_elapsed_time_ms_{tag}.csv"]
        assert rows[0] == ["step", f"elapsed_time_ms_{tag}"] and [r[0] for r in rows[1:]] == ["8", "16"]
        assert all(float(r[1]) >= 0 for r in rows[1:])


def test_wall_clock_breakdown_prints_deepspeeds_lines(fp16_run):
    _, printed = fp16_run
    assert printed[1] == ""   # rank 0 prints for everyone
    lines = printed[0].splitlines()
    micro = re.compile(r"\[Rank 0\] time \(ms\)" + "".join(rf" \| {n}: \d+\.\d\d" for n in MICRO) + "$")
    whole = re.compile(r"\[Rank 0\] time \(ms\)" + "".join(rf" \| {n}: \d+\.\d\d" for n in GLOBAL) + "$")
    kinds = ["micro" if micro.match(line) else "global" if whole.match(line) else line for line in lines]
    assert kinds == ["micro", "micro", "global"] * 2
    fwd = [float(line.split("fwd_microstep: ")[1].split(" ")[0]) for line in lines if micro.match(line)]
    step_fwd = float(lines[2].split("| fwd: ")[1].split(" ")[0])
    assert step_fwd == pytest.approx(fwd[0] + fwd[1], abs=0.011)   # the step's timer sums its micro-steps


@pytest.mark.skipif(not HAS["tensorboard"], reason="needs the tensorboard package (pip install tensorboard)")
def test_tensorboard_gets_the_same_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run_ranks(_run(str(tmp_path), tensorboard={"enabled": True, "output_path": str(tmp_path / "tb")}),
              world_size=2, tp=None)
    events = EventAccumulator(str(tmp_path / "tb" / "DeepSpeedJobName"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("Train/Samples/lr")] == [(8, 0.01), (16, pytest.approx(0.0325))]


@pytest.mark.skipif(not HAS["wandb"], reason="needs the wandb package (pip install wandb)")
def test_wandb_offline_run_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    run_ranks(_run(str(tmp_path), wandb={"enabled": True, "project": "minitron-test"}), world_size=2, tp=None)
    assert list(tmp_path.glob("wandb/offline-run-*"))
