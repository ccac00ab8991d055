"""A shard moved into another rank's place is refused (runtime/checkpoint/shard_owner.py).

The scenario: tensor ranks 0 and 1 of a checkpoint swap their files, and the checksums in
metadata.json are recomputed, as a user who moved the files would do to get past the checksum
check. Before the owner record, rank 0 then loaded rank 1's half of every weight (same shapes)
and trained on. Now `pretrain --load` says so in one line, exit code 2, before any rank starts:
for the legacy format, DeepSpeed's layout and torch_dist. An untouched resume still repeats the
uninterrupted run bit for bit, and a file without a record (an older minitron's) makes no claim.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from cli_here import run_minitron
from distributed import pretrain_records, run_ranks
from minitron.core.dist_checkpointing.file_owner import read_file_owner
from minitron.runtime.checkpoint.shard_owner import owner, owner_mismatch, read_owner, stamp_owner
from minitron.training.checkpoint_files import CheckpointError, file_digest, iteration_dir, read_metadata
from minitron.training.checkpoint_files_dist import check_sharded_files

MODEL = ["--tensor-model-parallel-size", "2", "--num-layers", "2", "--hidden-size", "16",
         "--num-attention-heads", "2", "--seq-length", "8", "--micro-batch-size", "1", "--global-batch-size", "2",
         "--train-iters", "2", "--lr", "1e-2", "--mock-data", "--vocab-size", "127",
         "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0.1", "--seed", "7",
         "--distributed-backend", "gloo"]


# The refusals below run `minitron pretrain`'s entry point in this process
# (cli_here.minitron_here), which has torch and minitron loaded already, not in a fresh
# interpreter that imports them again (~1 s of CPU each): the refusal comes before any rank
# starts, so nothing forks, and an exit code other than 2 still fails the test.


def _ds_config(path: Path) -> str:
    path.write_text(json.dumps({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
                                "zero_optimization": {"stage": 1}}))
    return str(path)


def formats(tmp: Path) -> dict:
    return {"torch": ["--ckpt-format", "torch"], "torch_dist": ["--ckpt-format", "torch_dist"],
            "deepspeed": ["--deepspeed", "--deepspeed-config", _ds_config(tmp / "ds.json")]}


# What each layout's tensor ranks 0 and 1 write, and so what the test swaps.
SWAPPED = {"torch": ("mp_rank_00/model_optim_rng.pt", "mp_rank_01/model_optim_rng.pt"),
           "torch_dist": ("__0_0.distcp", "__1_0.distcp"),
           "deepspeed": ("mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt")}


def _tag_dir(ck: Path, fmt: str) -> Path:
    return ck / "global_step1" if fmt == "deepspeed" else iteration_dir(ck, 1)


def resign(where: Path) -> None:
    """Make metadata.json vouch for the files as they are now."""
    meta = json.loads((where / "metadata.json").read_text())
    for rel in meta["files"]:
        meta["files"][rel] = {"bytes": (where / rel).stat().st_size, "sha256": file_digest(where / rel)}
    (where / "metadata.json").write_text(json.dumps(meta, indent=1))


def swap_and_resign(ck: Path, fmt: str, names: tuple[str, str] | None = None) -> None:
    """Swap the two files, then make metadata.json vouch for them again (DeepSpeed's layout has
    no checksums to redo)."""
    where = _tag_dir(ck, fmt)
    a, b = (where / name for name in names or SWAPPED[fmt])
    tmp = a.with_name("swap.tmp")
    os.replace(a, tmp), os.replace(b, a), os.replace(tmp, b)
    if fmt != "deepspeed":
        resign(where)


def strip_distcp_owners(where: Path) -> None:
    """Make the .distcp files what a save before the owner record wrote: DCP's items alone."""
    for path in where.glob("*.distcp"):
        record, end = read_file_owner(path)
        assert record is not None, path
        os.truncate(path, end)
    resign(where)


def keep_the_first_save(ck: Path, fmt: str) -> None:
    """A run that saved at iterations 1 and 2, made a checkpoint of iteration 1 alone: what a run
    stopped after its first iteration leaves (the resume must then repeat iteration 2)."""
    shutil.rmtree(ck / "global_step2" if fmt == "deepspeed" else iteration_dir(ck, 2))
    (ck / "latest_checkpointed_iteration.txt").write_text("1")   # Megatron's tracker (DeepSpeed's runs too)
    if fmt == "deepspeed":
        (ck / "latest").write_text("global_step1")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Per format: the uninterrupted run's losses, and the checkpoint it saved after its first
    iteration (one run, not a whole one and a stopped one: a launch of two ranks costs more
    than the save it spares)."""
    tmp = tmp_path_factory.mktemp("owner")
    runs = {}
    for fmt, flags in formats(tmp).items():
        ck = tmp / f"ck-{fmt}"
        whole = pretrain_records(tmp / f"whole-{fmt}", 2, MODEL + flags + ["--save", str(ck), "--save-interval", "1"])
        keep_the_first_save(ck, fmt)
        runs[fmt] = (whole, ck, flags)
    return runs


@pytest.mark.parametrize("fmt", list(SWAPPED))
def test_an_untouched_resume_repeats_the_next_loss(saved, tmp_path, fmt):
    whole, ck, flags = saved[fmt]
    rest = pretrain_records(tmp_path / "second", 2, MODEL + flags + ["--load", str(ck)])
    assert [r["lm_loss"] for r in rest] == [r["lm_loss"] for r in whole[1:]]   # dropout on: bit for bit


@pytest.mark.parametrize("fmt", list(SWAPPED))
def test_swapped_tensor_rank_files_are_refused_before_any_rank_starts(saved, tmp_path, fmt):
    _, ck, flags = saved[fmt]
    shutil.copytree(ck, tmp_path / "ck")
    swap_and_resign(tmp_path / "ck", fmt)
    done = run_minitron("pretrain", "--world", 2, "--log-dir", tmp_path / "logs", *MODEL, *flags,
                        "--load", tmp_path / "ck", here=True)   # in this process: see the note above _ds_config
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    line = done.stderr.strip()
    assert line.count("\n") == 0 and "Traceback" not in line, line
    assert SWAPPED[fmt][0].split("/")[-1] in line and "back where the save wrote it" in line, line
    assert not (tmp_path / "logs").exists()   # nothing started


@pytest.mark.parametrize("fmt", ["torch", "deepspeed"])
def test_each_file_records_its_owner(saved, fmt):
    _, ck, _ = saved[fmt]
    for rank, name in enumerate(SWAPPED[fmt]):
        record = read_owner(_tag_dir(ck, fmt) / name)
        assert record["tensor_model_parallel_rank"] == rank and record["tensor_model_parallel_size"] == 2


def test_the_record_is_the_archive_comment_which_torch_load_ignores(tmp_path):
    path = tmp_path / "shard.pt"
    torch.save({"w": torch.arange(6.0)}, path)
    assert read_owner(path) is None          # an older minitron's file: no claim
    stamp_owner(path, owner(1, 2))
    assert read_owner(path) == owner(1, 2)
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.arange(6.0))
    assert torch.equal(torch.load(path, weights_only=True, mmap=True)["w"], torch.arange(6.0))
    with pytest.raises(ValueError, match="does not end as torch.save"):
        stamp_owner(path, owner(0, 2))       # stamped once; a second stamp would hide the first
    (tmp_path / "text.pt").write_text("not a zip")
    assert read_owner(tmp_path / "text.pt") is None


def test_a_mismatch_says_moved_or_other_layout():
    assert owner_mismatch("f.pt", None, owner(0, 2)) is None
    assert owner_mismatch("f.pt", owner(0, 2, dp=1, dp_size=2), owner(0, 2)) is None   # only shared keys
    moved = owner_mismatch("f.pt", owner(1, 2), owner(0, 2), "rank 0")
    assert moved.startswith("rank 0: f.pt holds the shard of tensor rank 1 of 2, but sits where the shard "
                            "of tensor rank 0 of 2 belongs"), moved
    other = owner_mismatch("f.pt", owner(0, 2), owner(0, 4))
    assert "tensor-model-parallel-size 2, not this run's 4" in other, other


def _zero_partitions_swapped(root: str):
    """DeepSpeed's engine at dp 2, ZeRO 1: saved, rank 0's and rank 1's partitions swapped, loaded."""
    def body(rank):
        from minitron.runtime import initialize   # in the rank: the engine needs its process group
        config = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
                  "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
        engine, *_ = initialize(model=torch.nn.Linear(4, 3), config=config)
        engine.save_checkpoint(root)
        if rank == 0:
            tag = Path(root) / "global_step0"
            a, b = (tag / f"zero_pp_rank_{d}_mp_rank_00_optim_states.pt" for d in (0, 1))
            os.replace(a, tag / "x"), os.replace(b, a), os.replace(tag / "x", b)
        torch.distributed.barrier()
        try:
            engine.load_checkpoint(root)
            return "loaded"
        except ValueError as refusal:
            return str(refusal)
    return body


def test_deepspeed_partitions_swapped_between_data_parallel_ranks_are_refused_at_load(tmp_path):
    for rank, said in enumerate(run_ranks(_zero_partitions_swapped(str(tmp_path)), world_size=2, tp=None)):
        assert said.startswith(f"rank {rank}: ") and "\n" not in said, said
        assert f"data-parallel rank {1 - rank} of 2, but sits where the shard of data-parallel rank {rank}" in said


def _tp4() -> list[str]:
    """MODEL at tensor-parallel size 4 (four heads, so that each rank has one), torch_dist."""
    flags = list(MODEL)
    for flag, value in (("--tensor-model-parallel-size", "4"), ("--num-attention-heads", "4")):
        flags[flags.index(flag) + 1] = value
    return flags + ["--ckpt-format", "torch_dist"]


def test_same_sized_distcp_files_swapped_are_refused_by_their_owner_records(tmp_path):
    """At tp 4, tensor ranks 1 and 2 write items of the same sizes in the same order (rank 0 alone
    writes the replicated norms), so their .distcp files fit each other's byte ranges exactly:
    only the owner record at each file's end tells them apart."""
    ck = tmp_path / "ck"
    pretrain_records(tmp_path / "first", 4, _tp4() + ["--exit-interval", "1", "--save", str(ck)])
    where = iteration_dir(ck, 1)
    assert (where / "__1_0.distcp").stat().st_size == (where / "__2_0.distcp").stat().st_size
    assert [read_file_owner(where / f"__{r}_0.distcp")[0]["tensor_model_parallel_rank"] for r in range(4)] == \
        [0, 1, 2, 3]
    swap_and_resign(ck, "torch_dist", ("__1_0.distcp", "__2_0.distcp"))
    done = run_minitron("pretrain", "--world", 4, "--log-dir", tmp_path / "logs", *_tp4(), "--load", ck,
                        here=True)   # in this process: see the note above _ds_config
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    line = done.stderr.strip()
    assert line.count("\n") == 0 and "Traceback" not in line, line
    assert "__1_0.distcp holds the items of rank 2 (tensor rank 2 of 4)" in line, line
    assert "rank 1's (tensor rank 1 of 4)" in line and "back where the save wrote it" in line, line
    assert not (tmp_path / "logs").exists()   # nothing started
    # Without the records (a checkpoint from before them) the swap fits every byte range: the gap
    # the records close. Such a checkpoint makes no claim and passes, as it did.
    strip_distcp_owners(where)
    check_sharded_files(ck, 1, read_metadata(ck, 1))


def test_a_torch_dist_checkpoint_without_owner_records_resumes_as_before(saved, tmp_path):
    whole, ck, flags = saved["torch_dist"]
    shutil.copytree(ck, tmp_path / "ck")
    strip_distcp_owners(iteration_dir(tmp_path / "ck", 1))
    rest = pretrain_records(tmp_path / "second", 2, MODEL + flags + ["--load", str(tmp_path / "ck")])
    assert [r["lm_loss"] for r in rest] == [r["lm_loss"] for r in whole[1:]]


def test_an_unsigned_distcp_file_among_signed_ones_is_refused(saved, tmp_path):
    _, ck, _ = saved["torch_dist"]
    shutil.copytree(ck, tmp_path / "ck")
    where = iteration_dir(tmp_path / "ck", 1)
    os.truncate(where / "__1_0.distcp", read_file_owner(where / "__1_0.distcp")[1])
    resign(where)
    with pytest.raises(CheckpointError, match=r"__1_0.distcp carries no owner record, but the other"):
        check_sharded_files(tmp_path / "ck", 1, read_metadata(tmp_path / "ck", 1))
