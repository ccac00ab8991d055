"""Save with --ckpt-format torch_dist at one layout, resume at another: the resumed losses are
the serial run's at the same iterations (rel 1e-5, as test_training_equivalence.py).

Saved at world 8 (tp 2, pp 2, dp 2) with the distributed optimizer; resumed at tp 1 x pp 4,
tp 4 x pp 1, tp 1 x dp 8 (with and without the distributed optimizer), pp 2 x vp 2, and
serially. --no-load-optim resumes with fresh moments (the losses leave the serial run's: the
check can fail), and a save killed half-way leaves the previous checkpoint the latest. The legacy
format honours --no-load-optim and --no-load-rng too; an MoE model saved at ep 2 resumes serially.
A stress test (.ci/run's stress stage): about a minute and a half of 8-rank runs on 2 cores.
"""

from __future__ import annotations

import json

import pytest

from distributed import pretrain_records
from minitron.launcher import LaunchConfig, Target, launch
from minitron.training.checkpoint_files import TRACKER, iteration_dir

pytestmark = pytest.mark.stress

MODEL = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "4", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo", "--swiglu"]


def layout(tp: int, pp: int, *extra) -> list[str]:
    return ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp), *extra]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    serial = pretrain_records(tmp / "serial", 1, MODEL)
    first = pretrain_records(tmp / "first", 8, MODEL + layout(2, 2, "--use-distributed-optimizer") + [
        "--exit-interval", "2", "--save", str(tmp / "ck"), "--ckpt-format", "torch_dist"])
    return tmp, serial, first


def _losses(records):
    return [r["lm_loss"] for r in records]


def test_the_first_half_is_the_serial_run(saved):
    _, serial, first = saved
    assert _losses(first) == pytest.approx(_losses(serial)[:2], rel=1e-5)
    ck = saved[0] / "ck"
    assert (ck / TRACKER).read_text() == "2"
    meta = json.loads((iteration_dir(ck, 2) / "metadata.json").read_text())
    assert meta["sharded_backend"] == "torch_dist"


RESUMES = {
    "tp1-pp4": (4, layout(1, 4)),
    "tp4-pp1-distopt": (4, layout(4, 1, "--use-distributed-optimizer")),
    "tp1-pp1-dp8-distopt": (8, layout(1, 1, "--use-distributed-optimizer")),
    "tp1-pp1-dp8": (8, layout(1, 1)),
    "pp2-vp2": (2, layout(1, 2, "--virtual-pipeline-model-parallel-size", "2")),
    "serial": (1, layout(1, 1)),
}


@pytest.mark.parametrize("name", list(RESUMES))
def test_resumed_at_another_layout_continues_the_serial_run(saved, name):
    tmp, serial, _ = saved
    world, flags = RESUMES[name]
    second = pretrain_records(tmp / f"resumed-{name}", world, MODEL + flags + ["--load", str(tmp / "ck")])
    assert [r["iteration"] for r in second] == [3, 4]
    assert _losses(second) == pytest.approx(_losses(serial)[2:], rel=1e-5)


def test_no_load_optim_starts_fresh_moments(saved):
    tmp, serial, _ = saved
    second = pretrain_records(tmp / "fresh", 1, MODEL + ["--load", str(tmp / "ck"), "--no-load-optim"])
    assert _losses(second)[1] != pytest.approx(_losses(serial)[3], rel=1e-5)


def test_a_killed_save_leaves_the_previous_checkpoint_latest(saved):
    import shutil
    tmp, serial, _ = saved
    ck = tmp / "killed"
    shutil.copytree(tmp / "ck", ck)
    # A save of iteration 4 killed half-way: its .tmp directory exists, the marker never moved.
    broken = iteration_dir(ck, 4).with_name("iter_0000004.tmp")
    broken.mkdir()
    (broken / "__0_0.distcp").write_bytes(b"partial")
    second = pretrain_records(tmp / "after-kill", 1, MODEL + ["--load", str(ck)])
    assert _losses(second) == pytest.approx(_losses(serial)[2:], rel=1e-5)


MOE = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
       "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "4", "--lr", "1e-2",
       "--mock-data", "--vocab-size", "127", "--make-vocab-size-divisible-by", "32",
       "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7", "--distributed-backend", "gloo",
       "--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "1e-2", "--moe-layer-freq", "2"]


def test_moe_saved_at_ep2_resumes_at_ep1(tmp_path):
    """Experts are keyed by their global index: the ep 2 run's experts 2 and 3 (on expert rank 1)
    are experts 2 and 3 of a serial resume."""
    serial = pretrain_records(tmp_path / "moe-serial", 1, MOE)
    pretrain_records(tmp_path / "moe-ep2", 4, MOE + ["--expert-model-parallel-size", "2", "--use-distributed-optimizer",
                                                     "--exit-interval", "2", "--save", str(tmp_path / "ck"),
                                                     "--ckpt-format", "torch_dist"])
    resumed = pretrain_records(tmp_path / "moe-resumed", 1, MOE + ["--load", str(tmp_path / "ck")])
    assert _losses(resumed) == pytest.approx(_losses(serial)[2:], abs=1e-5)


def test_same_layout_resume_with_dropout_is_exact(tmp_path):
    """At the layout that wrote it, torch_dist restores every rank's random streams too: with
    dropout on, the resumed run repeats the uninterrupted one bit for bit (test_checkpointing.py
    holds the legacy format to the same)."""
    flags = MODEL + layout(1, 2, "--use-distributed-optimizer") + ["--hidden-dropout", "0.1"]
    full = pretrain_records(tmp_path / "full", 4, flags)
    first = pretrain_records(tmp_path / "first", 4, flags + ["--exit-interval", "2", "--save", str(tmp_path / "ck")])
    second = pretrain_records(tmp_path / "second", 4, flags + ["--load", str(tmp_path / "ck")])
    assert [(r["lm_loss"], r["grad_norm"]) for r in full] == [(r["lm_loss"], r["grad_norm"]) for r in first + second]


def test_legacy_format_honours_no_load_optim_and_no_load_rng(saved):
    """--ckpt-format torch reads the same two flags: fresh moments leave the serial run; the
    weights and moments without the random states (dropout off) repeat it."""
    tmp, serial, _ = saved
    pretrain_records(tmp / "legacy-first", 1, MODEL + ["--exit-interval", "2", "--save", str(tmp / "legacy"),
                                                       "--ckpt-format", "torch"])
    fresh = pretrain_records(tmp / "legacy-fresh", 1, MODEL + ["--load", str(tmp / "legacy"), "--no-load-optim"])
    assert _losses(fresh)[1] != pytest.approx(_losses(serial)[3], rel=1e-5)
    no_rng = pretrain_records(tmp / "legacy-no-rng", 1, MODEL + ["--load", str(tmp / "legacy"), "--no-load-rng"])
    assert _losses(no_rng) == pytest.approx(_losses(serial)[2:], rel=1e-5)


def test_ckpt_convert_format_turns_a_legacy_checkpoint_into_one_any_layout_resumes(saved):
    """Megatron's --ckpt-convert-format / --ckpt-convert-save: the legacy checkpoint of
    test_legacy_format_... (world 1), converted, resumes at pp 2 x dp 2 on the serial losses."""
    tmp, serial, _ = saved
    if not (tmp / "legacy").exists():
        pretrain_records(tmp / "legacy-first", 1, MODEL + ["--exit-interval", "2", "--save", str(tmp / "legacy"),
                                                           "--ckpt-format", "torch"])
    # A run that trains nothing writes no records: launched as is, its log read.
    launch(LaunchConfig(world_size=1, log_dir=tmp / "convert"), Target(module="minitron.pretrain_gpt", argv=MODEL + [
        "--load", str(tmp / "legacy"), "--ckpt-convert-format", "torch_dist",
        "--ckpt-convert-save", str(tmp / "converted")]))
    assert "> converted checkpoint: torch -> torch_dist" in (tmp / "convert" / "rank0.log").read_text()
    assert json.loads((iteration_dir(tmp / "converted" / "torch_dist", 2) / "metadata.json").read_text())[
        "sharded_backend"] == "torch_dist"
    resumed = pretrain_records(tmp / "from-converted", 4, MODEL + layout(1, 2) + [
        "--load", str(tmp / "converted" / "torch_dist")])
    assert _losses(resumed) == pytest.approx(_losses(serial)[2:], rel=1e-5)
