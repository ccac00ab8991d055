"""--use-torch-fsdp2 saves and resumes through --ckpt-format torch_dist (issue #37).

FSDP2's sharded_state_dict describes each parameter as the rows this rank holds, at their place
in the global tensor (core/distributed/torch_fully_sharded_data_parallel.py), so the checkpoint
is the one DDP writes, cut differently. One chain of four runs of a 2-layer GPT (fc1 of 71
rows: dp 2 cuts it 36 + 35, dp 4 18 + 18 + 18 + 17):

    A  FSDP2 dp 2, six iterations, saving at 2, 4, 6         the uninterrupted run
    B  FSDP2 dp 2 from A's iteration 2, exits at 4           its losses and norms are A's, bit for bit
    D  DDP   dp 2 from A's iteration 2, exits at 4, saving   A's, to 1e-5 relative (see TOL)
    E  FSDP2 dp 4 from D's iteration 4, to 6                 A's, to 1e-5 relative

The checkpoint holds each parameter's rows as FSDP2's ranks wrote them, and its .distcp files
carry the owner records other torch_dist checkpoints carry: a file moved to another rank's name
is refused before any rank starts. The chain is scripts/torch_fsdp2_ckpt_runs.py's, whose committed
results chapter 12 prints.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest

from minitron.core.dist_checkpointing.file_owner import read_file_owner
from minitron.training.checkpoint_files import CheckpointError, file_digest, iteration_dir, read_metadata
from minitron.training.checkpoint_files_dist import check_sharded_files

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
runs = importlib.import_module("torch_fsdp2_ckpt_runs")   # chapter 12's committed runs: the same chain
COMMITTED = json.loads(runs.JSON.read_text())
# Another layout sums the same fp32 gradients in another order (dp 2 reduces pairs, dp 4 a
# reduce-scatter of four, DDP an all-reduce of its bucket): rounding, measured at 4.8e-7 of a
# loss and 2.4e-7 of a norm at most (the committed runs), so 1e-5 relative leaves room; a row
# read back into the wrong place changes a weight itself, not the last bits of a sum.
TOL = 1e-5


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp2ckpt")
    curves = runs.chain(tmp)
    return tmp, curves["A"], curves["B"], curves["D"], curves["E"]


def test_fsdp2_resumes_at_dp2_bit_for_bit(chain):
    _, a, b, _, _ = chain
    assert [it for it, _, _ in a] == [1, 2, 3, 4, 5, 6] and a[-1][1] < a[0][1]   # it trained
    assert b == a[2:4]


@pytest.mark.parametrize("run, span", [(3, slice(2, 4)), (4, slice(4, 6))], ids=["fsdp2-to-ddp", "ddp-to-fsdp2-dp4"])
def test_another_layout_resumes_within_rounding(chain, run, span):
    resumed, uninterrupted = chain[run], chain[1][span]
    assert [it for it, _, _ in resumed] == [it for it, _, _ in uninterrupted]
    for (_, loss, norm), (_, a_loss, a_norm) in zip(resumed, uninterrupted):
        assert loss == pytest.approx(a_loss, rel=TOL) and norm == pytest.approx(a_norm, rel=TOL)


def test_checkpoint_holds_each_ranks_rows(chain):
    from minitron.core.dist_checkpointing.serialization import read_dcp_metadata

    meta = read_dcp_metadata(iteration_dir(chain[0] / "ckA", 2)).state_dict_metadata
    rows = [[[layer, row, 0], [1, n, 32]] for layer in (0, 1) for row, n in ((0, 36), (36, 35))]
    for key in (runs.SHOWN, f"optimizer.state.exp_avg.{runs.SHOWN}"):
        assert tuple(meta[key].size) == (2, 71, 32)   # the global tensor: both layers, all rows
        assert runs.chunks(iteration_dir(chain[0] / "ckA", 2), key) == rows
    # DDP's save of the same tensor: one chunk per layer, written by data-parallel rank 0.
    assert runs.chunks(iteration_dir(chain[0] / "ckD", 4)) == [[[0, 0, 0], [1, 71, 32]], [[1, 0, 0], [1, 71, 32]]]


def test_chapter_12s_committed_runs_are_these(chain):
    """docs/fsdp-runs/torch_fsdp2_ckpt.json (scripts/torch_fsdp2_ckpt_runs.py) holds this chain's
    curves and chunks: the same flags on the same kind of ranks, so the same sums in the same
    order (rel 1e-6 leaves the last bits to another CPU's kernels)."""
    tmp, *curves = chain
    assert COMMITTED["model"] == runs.MODEL
    for name, curve in zip("ABDE", curves):
        committed = COMMITTED["runs"][name]["curve"]
        assert [c[0] for c in committed] == [it for it, _, _ in curve]
        assert [c[1:] for c in committed] == [pytest.approx([loss, norm], rel=1e-6) for _, loss, norm in curve]
    assert COMMITTED["chunks"] == {"A@2": runs.chunks(iteration_dir(tmp / "ckA", 2)),
                                   "D@4": runs.chunks(iteration_dir(tmp / "ckD", 4))}


def test_each_file_names_its_writer_and_a_moved_one_is_refused(chain, tmp_path):
    root = chain[0] / "at2"
    where = iteration_dir(root, 2)
    for rank in (0, 1):
        record, _ = read_file_owner(where / f"__{rank}_0.distcp")
        assert (record["rank"], record["data_parallel_rank"], record["data_parallel_size"]) == (rank, rank, 2)
    check_sharded_files(root, 2, read_metadata(root, 2))   # untouched: accepted
    # Swap the two ranks' files and re-sign the checksums, as someone moving them would.
    moved = tmp_path / "moved"
    runs.at(root, 2, moved)
    there = iteration_dir(moved, 2)
    os.replace(there / "__0_0.distcp", there / "swap")
    os.replace(there / "__1_0.distcp", there / "__0_0.distcp")
    os.replace(there / "swap", there / "__1_0.distcp")
    meta = json.loads((there / "metadata.json").read_text())
    for name in ("__0_0.distcp", "__1_0.distcp"):
        meta["files"][name] = {"bytes": (there / name).stat().st_size, "sha256": file_digest(there / name)}
    (there / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="moved or renamed between ranks"):
        check_sharded_files(moved, 2, read_metadata(moved, 2))


@pytest.mark.stress
def test_swiglu_at_tp2_resumes_at_tp1(tmp_path):
    """SwiGLU's fc1 at tp 2 is stored as gate and up pieces (a ShardedTensorFactory), which FSDP2's
    rows cut again: rank 0 of dp holds gate rows only, rank 1 up rows only. A save at tp 2 x dp 2
    resumes at tp 2 x dp 2 bit for bit and at tp 1 x dp 2 to TOL (tp 1 cuts the matmuls otherwise)."""
    from distributed import pretrain_records

    model = [*runs.MODEL, *runs.FSDP2, "--swiglu", "--ffn-hidden-size", "72"]
    tp2 = ["--tensor-model-parallel-size", "2"]

    def curve(name, world, flags):
        return [(r["iteration"], r["lm_loss"], r["grad_norm"])
                for r in pretrain_records(tmp_path / name, world, [*model, *flags, "--exit-interval", "4"])]
    full = curve("full", 4, [*tp2, "--save", str(tmp_path / "ck"), "--save-interval", "2"])
    runs.at(tmp_path / "ck", 2, tmp_path / "at2")
    assert curve("tp2", 4, [*tp2, "--load", str(tmp_path / "at2")]) == full[2:4]
    for (it, loss, norm), (a_it, a_loss, a_norm) in zip(curve("tp1", 2, ["--load", str(tmp_path / "at2")]), full[2:4]):
        assert it == a_it and loss == pytest.approx(a_loss, rel=TOL) and norm == pytest.approx(a_norm, rel=TOL)
