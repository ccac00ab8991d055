"""`minitron ckpt inspect DIR --tp T --pp P --dp D` and `minitron ckpt convert` (issue #28).

One tiny GPT (SwiGLU, tied embeddings, Adam) is saved by pretrain at tp 2 on 2 ranks. Then:

* the bytes `inspect` predicts for each rank of a target layout are the bytes a real resume at
  that layout reads (DCP's own plan, counted by ``dist_checkpointing.load(bytes_read=...)``),
  for tp 1 × pp 2 and for tp 1 serially (two layouts that cut the model differently);
* an MoE model saved at expert-parallel size 2, read serially and at ep 2 (stress);
* `convert` turns it into --ckpt-format torch and back to torch_dist, and each converted
  checkpoint resumes to the losses of the original's resume.

The refusals (missing dir, wrong format, DST exists, a layout that does not divide the model)
are rows of tests/test_bad_inputs_files.py. A plain run does the prediction checks (~2 s); the
conversions start 3 more runs and are `stress` (.ci/run's stress stage).
"""

from __future__ import annotations

import json
import sys

import pytest

import torch

from cli_here import minitron_here
from minitron.cli.ckpt import predicted_reads
from minitron.cli.views.ckpt_plan import Target as Layout
from minitron.core import dist_checkpointing
from minitron.launcher import LaunchConfig, RankFailure, Target, launch, session_env

MODEL = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "4", "--seq-length", "8",
         "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "1e-3", "--mock-data", "--vocab-size", "60",
         "--make-vocab-size-divisible-by", "8", "--hidden-dropout", "0", "--attention-dropout", "0", "--swiglu", "--ffn-hidden-size", "32",
         "--distributed-backend", "gloo", "--seed", "3"]


def _run(out, world: int, argv: list[str]) -> list[float]:
    """pretrain_gpt on ``world`` forked ranks; the lm losses it logged (none for a pure load)."""
    out.mkdir(parents=True)
    argv = [*argv, "--log-jsonl", str(out / "iterations.jsonl")]
    try:
        launch(LaunchConfig(world_size=world, log_dir=out / "logs", env=session_env(world, None)),
               Target(module="minitron.pretrain_gpt", argv=argv))
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(30)}") from None
    log = out / "iterations.jsonl"
    return [json.loads(line)["lm_loss"] for line in open(log)] if log.exists() else []


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt_cli")
    _run(tmp / "first", 2, MODEL + ["--tensor-model-parallel-size", "2", "--train-iters", "1",
                                    "--save", str(tmp / "ck")])
    return tmp


def _real_reads(tmp, name: str, world: int, layout: list[str], monkeypatch) -> dict[int, int]:
    """Resume at ``layout`` without training (--train-iters 1 = the saved iteration) and count,
    per rank, the bytes DCP's plan reads. The ranks are forked from here, so they inherit the
    wrapped load."""
    counts = tmp / f"{name}-reads"
    counts.mkdir()
    real = dist_checkpointing.load

    def counting(sharded, where, strict=True, bytes_read=None):
        read: dict = {}
        out = real(sharded, where, strict=strict, bytes_read=read)
        (counts / str(torch.distributed.get_rank())).write_text(str(sum(read.values())))
        return out
    monkeypatch.setattr(dist_checkpointing, "load", counting)
    _run(tmp / name, world, MODEL + layout + ["--train-iters", "1", "--load", str(tmp / "ck")])
    return {int(p.name): int(p.read_text()) for p in counts.iterdir()}


def _predicted(tmp, *layout) -> dict[int, int]:
    _, _, plan = predicted_reads(tmp / "ck", Layout(*layout))
    return {p["rank"]: sum(p["files"].values()) for p in plan}


@pytest.mark.parametrize("name,world,flags,layout", [
    ("tp1-pp2", 2, ["--pipeline-model-parallel-size", "2"], (1, 2, 1)),
    pytest.param("serial", 1, [], (1, 1, 1), marks=pytest.mark.stress),
    pytest.param("dp2-distopt", 2, ["--use-distributed-optimizer"], (1, 1, 2), marks=pytest.mark.stress),
])
def test_predicted_bytes_are_what_a_resume_reads(saved, monkeypatch, name, world, flags, layout):
    real = _real_reads(saved, name, world, flags, monkeypatch)
    assert real and _predicted(saved, *layout) == real


@pytest.mark.stress
def test_predicted_bytes_of_a_mixture_of_experts(tmp_path, monkeypatch):
    """Experts are keyed by their global index: an expert-parallel rank reads its own experts."""
    moe = [a for a in MODEL if a != "--swiglu"] + ["--num-experts", "4", "--moe-router-topk", "2"]
    monkeypatch.setattr(sys.modules[__name__], "MODEL", moe)
    _run(tmp_path / "first", 2, moe + ["--expert-model-parallel-size", "2", "--train-iters", "1",
                                       "--save", str(tmp_path / "ck")])
    for name, world, flags, layout in (("serial", 1, [], (1, 1, 1)),
                                       ("ep2", 2, ["--expert-model-parallel-size", "2"], (1, 1, 2, None, 2))):
        with monkeypatch.context() as patch:
            real = _real_reads(tmp_path, name, world, flags, patch)
        assert real and _predicted(tmp_path, *layout) == real, name


def test_inspect_with_a_target_prints_each_rank_and_draws_them(saved):
    done = minitron_here("ckpt", "inspect", saved / "ck", "--tp", "1", "--pp", "2", "--svg", saved / "reads.svg")
    assert done.returncode == 0, done.stderr
    predicted = _predicted(saved, 1, 2, 1)
    for rank, count in predicted.items():
        assert f"{count:,}" in done.stdout
    svg = (saved / "reads.svg").read_text()
    assert svg.startswith("<svg") and "written by rank 1" in svg
    match = minitron_here("ckpt", "inspect", saved / "ck", "--tp", "4", "--match", "decoder.layers.mlp.linear_fc1.weight")
    assert match.returncode == 0, match.stderr
    # tp 4's piece of each [gate | up] half lies inside one tp 2 chunk: rank 3 reads rank 1's only.
    row = next(line for line in match.stdout.splitlines() if "tp3 pp0" in line)
    assert "writer 1: 4 chunks" in row and "writer 0" not in row


@pytest.mark.stress
def test_convert_both_ways_and_resume_to_the_same_losses(saved):
    # A longer run than the saved one changes the schedule's decay, which a resume refuses unless
    # told which schedule wins (Megatron's rule): this run's, for every side alike.
    resume = MODEL + ["--train-iters", "3", "--override-opt_param-scheduler"]
    original = _run(saved / "resumed", 2, resume + ["--tensor-model-parallel-size", "2", "--load", str(saved / "ck")])
    torch_ck, back = saved / "as-torch", saved / "back"
    done = minitron_here("ckpt", "convert", saved / "ck", torch_ck, "--ckpt-format", "torch")
    assert done.returncode == 0, done.stderr
    assert json.loads((torch_ck / "iter_0000001" / "metadata.json").read_text()).get("sharded_backend") is None
    done = minitron_here("ckpt", "convert", torch_ck, back, "--ckpt-format", "torch_dist")
    assert done.returncode == 0, done.stderr
    assert json.loads((back / "iter_0000001" / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    for name, ck, fmt in (("from-torch", torch_ck, "torch"), ("from-back", back, "torch_dist")):
        losses = _run(saved / name, 2, resume + ["--tensor-model-parallel-size", "2", "--load", str(ck),
                                                 "--ckpt-format", fmt])
        assert losses == pytest.approx(original, rel=1e-6) and len(losses) == 2
