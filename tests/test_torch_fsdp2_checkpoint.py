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
is refused before any rank starts.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from distributed import pretrain_records
from minitron.core.dist_checkpointing.file_owner import read_file_owner
from minitron.training.checkpoint_files import TRACKER, CheckpointError, file_digest, iteration_dir, read_metadata
from minitron.training.checkpoint_files_dist import check_sharded_files

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--ffn-hidden-size", "71", "--micro-batch-size", "1", "--global-batch-size", "4", "--lr", "1e-2",
         "--train-iters", "6", "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0",
         "--attention-dropout", "0", "--seed", "7", "--distributed-backend", "gloo", "--clip-grad", "1.0", "--untie-embeddings-and-output-weights",
         "--ckpt-format", "torch_dist"]
FSDP2 = ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]
# Another layout sums the same fp32 gradients in another order (dp 2 reduces pairs, dp 4 a
# reduce-scatter of four, DDP an all-reduce of its bucket): rounding, 1e-7 relative at most as
# test_torch_fsdp2.py measures it, so 1e-5 leaves room and still catches a misplaced row.
TOL = 1e-5


def _at(root, iteration: int, into):
    """A checkpoint directory whose latest is ``root``'s ``iteration`` (a copy: the run wrote later ones)."""
    into.mkdir()
    shutil.copytree(iteration_dir(root, iteration), iteration_dir(into, iteration))
    (into / TRACKER).write_text(str(iteration))
    return into


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    # Loaded once here, not once in each of the ten forked ranks: FSDP2 and DCP, about 1.3 s of
    # CPU a rank together.
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    tmp = tmp_path_factory.mktemp("fsdp2ckpt")
    a = pretrain_records(tmp / "A", 2, [*MODEL, *FSDP2, "--save", str(tmp / "ckA"), "--save-interval", "2"])
    at2 = _at(tmp / "ckA", 2, tmp / "at2")
    b = pretrain_records(tmp / "B", 2, [*MODEL, *FSDP2, "--exit-interval", "4", "--load", str(at2)])
    d = pretrain_records(tmp / "D", 2, [*MODEL, "--exit-interval", "4", "--load", str(at2), "--save", str(tmp / "ckD")])
    e = pretrain_records(tmp / "E", 4, [*MODEL, *FSDP2, "--load", str(tmp / "ckD")])
    return tmp, a, b, d, e


def _curve(records):
    return [(r["iteration"], r["lm_loss"], r["grad_norm"]) for r in records]


def test_fsdp2_resumes_at_dp2_bit_for_bit(chain):
    _, a, b, _, _ = chain
    assert [r["iteration"] for r in a] == [1, 2, 3, 4, 5, 6] and a[-1]["lm_loss"] < a[0]["lm_loss"]
    assert _curve(b) == _curve(a)[2:4]


@pytest.mark.parametrize("run, span", [(3, slice(2, 4)), (4, slice(4, 6))], ids=["fsdp2-to-ddp", "ddp-to-fsdp2-dp4"])
def test_another_layout_resumes_within_rounding(chain, run, span):
    resumed, uninterrupted = _curve(chain[run]), _curve(chain[1])[span]
    assert [it for it, _, _ in resumed] == [it for it, _, _ in uninterrupted]
    for (_, loss, norm), (_, a_loss, a_norm) in zip(resumed, uninterrupted):
        assert loss == pytest.approx(a_loss, rel=TOL) and norm == pytest.approx(a_norm, rel=TOL)


def test_checkpoint_holds_each_ranks_rows(chain):
    from minitron.core.dist_checkpointing.serialization import read_dcp_metadata

    meta = read_dcp_metadata(iteration_dir(chain[0] / "ckA", 2)).state_dict_metadata
    for key in ("decoder.layers.mlp.linear_fc1.weight", "optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight"):
        assert tuple(meta[key].size) == (2, 71, 32)   # the global tensor: both layers, all rows
        chunks = sorted((tuple(c.offsets), tuple(c.sizes)) for c in meta[key].chunks)
        assert chunks == [((layer, row, 0), (1, rows, 32)) for layer in (0, 1) for row, rows in ((0, 36), (36, 35))]
    # DDP's save of the same tensor: one chunk per layer, written by data-parallel rank 0.
    ddp = read_dcp_metadata(iteration_dir(chain[0] / "ckD", 4)).state_dict_metadata
    assert [tuple(c.sizes) for c in ddp["decoder.layers.mlp.linear_fc1.weight"].chunks] == [(1, 71, 32)] * 2


def test_each_file_names_its_writer_and_a_moved_one_is_refused(chain, tmp_path):
    root = chain[0] / "at2"
    where = iteration_dir(root, 2)
    for rank in (0, 1):
        record, _ = read_file_owner(where / f"__{rank}_0.distcp")
        assert (record["rank"], record["data_parallel_rank"], record["data_parallel_size"]) == (rank, rank, 2)
    check_sharded_files(root, 2, read_metadata(root, 2))   # untouched: accepted
    # Swap the two ranks' files and re-sign the checksums, as someone moving them would.
    moved = _at(root, 2, tmp_path / "moved")
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
