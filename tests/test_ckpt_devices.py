"""Checkpoints move between devices: the weights and the optimizer come through, the host's random
states come through, and the device's random states, which cannot be converted (a CPU generator is
mt19937, 5056 bytes; a CUDA one is Philox's seed and offset, 16 bytes), are reseeded from the
checkpoint's seed and iteration, with one line that says so (training/checkpointing_rng.py).

No CPU run can write a real CUDA checkpoint, but it can write one in the shape a GPU run writes:
the saving ranks' RNG capture is wrapped (the launcher forks the ranks from this process, so they
inherit the wrapper) to tag the states "cuda" and add a 16-byte cuda_rng_state and CUDA-form
tracker states. Resumed on gloo ranks, dropout off, the next losses are the uninterrupted run's
bit for bit, in all three layouts (torch_dist, torch, DeepSpeed's). The other way round, a CPU
checkpoint's states are loaded where the accelerator is a stand-in that says "cuda". The real
GPU <-> CPU round trips are at the end, marked gpu.
"""

from __future__ import annotations

import io
import json
import random
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_here import run_minitron
from distributed import pretrain_records, run_ranks
from minitron.accelerator import get_accelerator, set_accelerator
from minitron.accelerator.cpu_accelerator import CPU_Accelerator
from minitron.core.tensor_parallel import get_cuda_rng_tracker, model_parallel_cuda_manual_seed
from minitron.training import checkpointing
from minitron.training.checkpointing_rng import get_rng_state, set_rng_state

SAID = "do not convert"   # in the one line a reseeding resume prints

# Philox's state as torch.cuda.get_rng_state() gives it: seed and offset, two little-endian u64s.
PHILOX = torch.tensor([7] + [0] * 7 + [64] + [0] * 7, dtype=torch.uint8)


def as_a_gpu_run_saves(state: dict) -> dict:
    """A CPU rank's RNG states in the form a GPU rank writes: the host states as they are, a CUDA
    generator state, the tracker's streams with their CUDA part, tagged "cuda"."""
    tracker = {name: (value[0], PHILOX.clone()) if isinstance(value, tuple) else PHILOX.clone()
               for name, value in state["rng_tracker_states"].items()}
    return {**state, "cuda_rng_state": PHILOX.clone(), "rng_tracker_states": tracker, "device": "cuda"}


class CudaLikeAccelerator(CPU_Accelerator):
    """Says "cuda" where a device is named; computes nothing anywhere but the CPU."""

    def device_name(self, device_index=None) -> str:
        return "cuda"

    def current_device_name(self) -> str:
        return "cuda:0"


def _same(a, b) -> bool:
    """Equal nested states: tensors bit for bit, the rest by ==."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def _host_states() -> tuple:
    _, keys, pos, _, _ = np.random.get_state()
    return random.getstate(), keys.tolist(), pos, torch.get_rng_state()


def _seed_host(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --- set_rng_state on ranks (tp 2: the tracker's streams differ per rank) -------------------------

def _load_on_ranks(make_saved, accelerator_cls=None):
    """Each rank saves its states (``make_saved`` may reshape them), scrambles every generator,
    loads with seed 7 at iteration 2 (on ``accelerator_cls`` if given), and reports: are the host
    states the saved ones, is the tracker the saved one or a fresh run's at seed 7 + 2, and what
    was printed."""
    def body(rank):
        model_parallel_cuda_manual_seed(11)
        _seed_host(3)
        saved = make_saved(get_rng_state())
        host = _host_states()
        model_parallel_cuda_manual_seed(7 + 2)   # what a reseed must give: seed + iteration, stage 0
        fresh = get_cuda_rng_tracker().get_states()
        _seed_host(99)   # every generator elsewhere: the load must bring them back
        model_parallel_cuda_manual_seed(99)
        before = get_accelerator()
        if accelerator_cls is not None:
            set_accelerator(accelerator_cls())
        out = io.StringIO()
        try:
            with redirect_stdout(out):
                set_rng_state(saved, seed=7, iteration=2)
        finally:
            set_accelerator(before)
        tracker = get_cuda_rng_tracker().get_states()
        return {"host restored": _same(_host_states(), host),
                "tracker": "saved" if _same(tracker, saved.get("rng_tracker_states", saved.get("tracker")))
                else "fresh" if _same(tracker, fresh) else "other",
                "printed": out.getvalue()}
    return run_ranks(body, world_size=2, tp=2)


def test_a_cpu_checkpoint_on_cpu_ranks_restores_every_state():
    for result in _load_on_ranks(lambda state: state):
        assert result == {"host restored": True, "tracker": "saved", "printed": ""}


def test_a_gpu_checkpoint_on_cpu_ranks_reseeds_the_device_streams_and_says_so():
    results = _load_on_ranks(as_a_gpu_run_saves)
    assert [(r["host restored"], r["tracker"]) for r in results] == [(True, "fresh")] * 2
    printed = results[0]["printed"].strip()
    assert "\n" not in printed and SAID in printed and "cuda" in printed and "seed 7 + iteration 2" in printed
    assert results[1]["printed"] == ""   # one line, from rank 0


def test_a_cpu_checkpoint_where_the_accelerator_is_cuda_reseeds_and_says_so():
    results = _load_on_ranks(lambda state: state, CudaLikeAccelerator)
    assert [(r["host restored"], r["tracker"]) for r in results] == [(True, "fresh")] * 2
    assert SAID in results[0]["printed"] and "from cpu and this run computes on cuda" in results[0]["printed"]


def test_states_saved_before_megatrons_keys_still_load():
    """minitron's earlier form ({random, numpy, torch, tracker}, CPU only) restores as it did."""
    def older(state):
        return {"random": state["random_rng_state"], "numpy": state["np_rng_state"],
                "torch": state["torch_rng_state"], "tracker": state["rng_tracker_states"]}
    for result in _load_on_ranks(older):
        assert result == {"host restored": True, "tracker": "saved", "printed": ""}


# --- a whole run: saved in a GPU run's shape, resumed on gloo ranks ---------------------------------

MODEL = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "4", "--lr", "1e-2",
         "--mock-data", "--vocab-size", "127", "--make-vocab-size-divisible-by", "32",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7", "--distributed-backend", "gloo"]
FORMATS = {"torch_dist": ["--ckpt-format", "torch_dist", "--use-distributed-optimizer"],
           "torch": ["--ckpt-format", "torch", "--use-distributed-optimizer"],
           "deepspeed": ["--deepspeed"]}


def _ds_config(path: Path) -> str:
    path.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1,
                                "zero_optimization": {"stage": 1}}))
    return str(path)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("devices")
    megatron = pretrain_records(tmp / "whole", 2, MODEL)
    ds = pretrain_records(tmp / "whole-ds", 2, MODEL + ["--deepspeed", "--deepspeed-config",
                                                        _ds_config(tmp / "ds.json")])
    return tmp, {"torch_dist": megatron, "torch": megatron, "deepspeed": ds}


_FIRST: dict = {}   # format -> (its flags, the saving run's records, its checkpoint directory)


def saved_as_a_gpu_run(tmp: Path, fmt: str) -> tuple[list[str], list[dict], Path]:
    """Two iterations on gloo ranks whose saves have a GPU run's RNG states; once per format
    (the row test below reads the torch_dist save too)."""
    if fmt not in _FIRST:
        flags = MODEL + FORMATS[fmt] + (["--deepspeed-config", _ds_config(tmp / "ds.json")] if fmt == "deepspeed"
                                        else [])
        with pytest.MonkeyPatch.context() as patch:   # the forked saving ranks inherit it
            patch.setattr(checkpointing, "get_rng_state", lambda: as_a_gpu_run_saves(get_rng_state()))
            first = pretrain_records(tmp / "first", 2, flags + ["--exit-interval", "2", "--save", str(tmp / "ck")])
        _FIRST[fmt] = flags, first, tmp / "ck"
    return _FIRST[fmt]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_checkpoint_in_a_gpu_runs_shape_resumes_on_cpu_ranks(uninterrupted, tmp_path, fmt):
    _, whole = uninterrupted
    flags, first, ck = saved_as_a_gpu_run(tmp_path, fmt)
    second = pretrain_records(tmp_path / "second", 2, flags + ["--load", str(ck)])
    # Dropout off: the reseeded streams are never drawn from, so resuming changes no bit.
    assert [r["lm_loss"] for r in first + second] == [r["lm_loss"] for r in whole[fmt]]
    log = (tmp_path / "second" / "logs" / "rank0.log").read_text()
    assert sum(SAID in line for line in log.splitlines()) == 1, log[-2000:]


def test_with_the_distributed_optimizer_each_rank_writes_its_rows_of_the_state(tmp_path):
    """torch_dist at dp 2: each rank keeps and writes half the rows of each optimizer tensor (a save
    holds half the state, not all of it); the weights are still written by data-parallel rank 0.
    The save read is the torch_dist one above: its RNG states in a GPU run's form touch no optimizer row."""
    from minitron.core.dist_checkpointing.serialization import read_dcp_metadata
    from minitron.training.checkpoint_files import iteration_dir

    _, _, ck = saved_as_a_gpu_run(tmp_path, "torch_dist")
    meta = read_dcp_metadata(iteration_dir(ck, 2))
    files: dict[str, set] = {}
    for index, info in meta.storage_data.items():
        files.setdefault(index.fqn, set()).add(info.relative_path)
    key = "decoder.layers.mlp.linear_fc2.weight"   # (layers, 16, 64): 8 rows a rank
    assert files[f"optimizer.state.exp_avg.{key}"] == files[f"optimizer.state.exp_avg_sq.{key}"] == {
        "__0_0.distcp", "__1_0.distcp"}
    assert files[key] == {"__0_0.distcp"}
    rows = sorted((tuple(c.offsets), tuple(c.sizes)) for c in meta.state_dict_metadata[
        f"optimizer.state.exp_avg.{key}"].chunks)
    assert rows == [((layer, row, 0), (1, 8, 64)) for layer in range(2) for row in (0, 8)]


# --- real devices ---------------------------------------------------------------------------------

GPUS = torch.cuda.device_count()


def _pretrain(out: Path, backend: str, *flags) -> tuple[list[dict], str]:
    done = run_minitron("pretrain", "--world", 1, "--backend", backend, "--log-dir", out, *MODEL[:-2], *flags,
                        timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in open(out / "iterations.jsonl")], (out / "rank0.log").read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("saved_on, resumed_on", [("nccl", "gloo"), ("gloo", "nccl")])
def test_a_checkpoint_moves_between_a_gpu_and_the_cpu(tmp_path, fmt, saved_on, resumed_on):
    """Saved after 2 iterations on one kind of device, resumed on the other: the resumed losses are
    the uninterrupted run's on the saving device, to a CPU-vs-GPU kernel tolerance (fp32), and the
    resume says once that it reseeded the device streams."""
    flags = list(FORMATS[fmt]) + ["--use-cpu-initialization"]
    if fmt == "deepspeed":
        flags += ["--deepspeed-config", _ds_config(tmp_path / "ds.json")]
    whole, _ = _pretrain(tmp_path / "whole", saved_on, *flags)
    _pretrain(tmp_path / "first", saved_on, *flags, "--exit-interval", "2", "--save", tmp_path / "ck")
    rest, log = _pretrain(tmp_path / "second", resumed_on, *flags, "--load", tmp_path / "ck")
    assert [r["lm_loss"] for r in rest] == pytest.approx([r["lm_loss"] for r in whole[2:]], rel=1e-4)
    assert sum(SAID in line for line in log.splitlines()) == 1, log[-2000:]
