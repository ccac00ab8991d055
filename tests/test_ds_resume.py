"""`pretrain --deepspeed --save` then `--load`: the engine's checkpoint (DeepSpeed's layout) with
Megatron-DeepSpeed's client state resumes the run exactly, and a --load of another layout is
refused in one line before any rank starts.

ZeRO 2 on 2 data-parallel ranks, dropout on (so the RNG states must come back), Megatron's
cosine schedule with warm-up (so the engine's lr_scheduler state must too). The stop is
--exit-interval, as in test_checkpointing.py.
"""

import json
from pathlib import Path

import pytest

from cli_here import run_minitron
from distributed import pretrain_records, pretrain_records_each

ITERS = 4
FLAGS = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", str(ITERS), "--lr", "1e-3",
         "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--vocab-size", "1023",
         "--hidden-dropout", "0.1", "--seed", "5", "--distributed-backend", "gloo", "--deepspeed"]


def _config(path: Path, stage: int) -> str:
    path.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1,
                                "zero_optimization": {"stage": stage}}))
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dsresume")
    config = ["--deepspeed-config", _config(tmp / "ds.json", 2)]
    # One set of ranks runs the three in turn (each from its own start, as a fresh job would).
    runs = pretrain_records_each(tmp / "runs", 2, {
        "full": FLAGS + config, "first": FLAGS + config + ["--exit-interval", "2", "--save", str(tmp / "ck")],
        "second": FLAGS + config + ["--load", str(tmp / "ck")]})
    return tmp, runs["full"], runs["first"], runs["second"]


def test_resume_repeats_the_uninterrupted_run_exactly(runs):
    _, full, first, second = runs
    assert [r["iteration"] for r in first] == [1, 2]
    assert [r["iteration"] for r in second] == [3, 4]
    for a, b in zip(full, first + second, strict=True):
        assert (a["lm_loss"], a["lr"], a["grad_norm"]) == (b["lm_loss"], b["lr"], b["grad_norm"])


def test_the_checkpoint_is_deepspeeds_with_megatrons_marker(runs):
    ck = runs[0] / "ck"
    assert (ck / "latest").read_text() == "global_step2"
    assert (ck / "latest_checkpointed_iteration.txt").read_text() == "2"   # as Megatron-DeepSpeed writes
    assert sorted(p.name for p in (ck / "global_step2").iterdir()) == [
        "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt"]


@pytest.mark.parametrize("world, stage, says", [
    (4, 2, "lacks zero_pp_rank_2_mp_rank_00_optim_states.pt and 1 more"),
    (2, 3, "lacks zero_pp_rank_0_mp_rank_00_model_states.pt and 1 more"),   # stage 3: one per rank
    (1, 2, "has 1 file(s) this run would not read"),
])
def test_another_layout_is_refused_before_any_rank_starts(runs, tmp_path, world, stage, says):
    argv = FLAGS + ["--deepspeed-config", _config(tmp_path / "ds.json", stage), "--load", str(runs[0] / "ck")]
    done = run_minitron("pretrain", "--world", str(world), "--log-dir", str(tmp_path / "logs"), *argv, here=True)
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and says in line and "resume with the stage" in line, line
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("files, says", [
    ({"latest_checkpointed_iteration.txt": "2"}, "holds Megatron's layout"),
    ({"latest": "../elsewhere"}, "should name a tag such as global_step2"),
    ({"latest": ""}, "should name a tag"),
])
def test_what_is_no_deepspeed_checkpoint_is_refused(tmp_path, files, says):
    ck = tmp_path / "ck"
    ck.mkdir()
    for name, text in files.items():
        (ck / name).write_text(text)
    argv = FLAGS + ["--deepspeed-config", _config(tmp_path / "ds.json", 2), "--load", str(ck)]
    done = run_minitron("pretrain", "--world", "2", "--log-dir", str(tmp_path / "logs"), *argv, here=True)
    assert done.returncode == 2 and says in done.stderr and done.stderr.strip().count("\n") == 0, done.stderr


def test_a_universal_checkpoint_resumes_at_another_stage(runs, tmp_path):
    """The same checkpoint converted to a universal one (ds_to_universal) and loaded with the
    ds_config's checkpoint.load_universal at ZeRO 3: iterations 3-4 as the uninterrupted run's
    (test_ds_universal.py changes the data-parallel size too; here dropout's RNG states must
    map rank to rank, so the size stays)."""
    from minitron.runtime.checkpoint.ds_to_universal import main as ds_to_universal   # this test only
    tmp, full, _, _ = runs
    ds_to_universal(["--input_folder", str(tmp / "ck" / "global_step2"),
                     "--output_folder", str(tmp_path / "uni" / "global_step2")])
    config = json.loads(Path(_config(tmp_path / "ds.json", 3)).read_text())
    (tmp_path / "ds.json").write_text(json.dumps({**config, "checkpoint": {"load_universal": True}}))
    resumed = pretrain_records(tmp_path / "resumed", 2, FLAGS + ["--deepspeed-config", str(tmp_path / "ds.json"),
                                                                 "--load", str(tmp_path / "uni")])
    assert [r["iteration"] for r in resumed] == [3, 4]
    for a, b in zip(full[2:], resumed, strict=True):
        # The state comes back bit for bit, so the losses and learning rates are the same bits.
        assert (a["lm_loss"], a["lr"]) == (b["lm_loss"], b["lr"])
        # The norm is the same gradient's, summed in another order: ZeRO 2 splits one flat
        # buffer across the ranks, ZeRO 3 every parameter, so each rank adds other squares
        # (float64) before the all-reduce. Measured: 1 in 1e16 apart; 1e-12 bounds any order.
        # (The clip factor made from it is applied in float32, where the difference vanishes,
        # which is why the losses after it still agree exactly.)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-12, abs=0)
