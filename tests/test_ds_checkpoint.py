"""The engine's checkpoints in DeepSpeed 0.19.8's layout (minitron/runtime/checkpoint/): the file
list and the keys at ZeRO 0-3 in fp32, fp16 and bf16, a save -> load round trip that repeats the
next step exactly, the old layout refused in one line, and the copied zero_to_fp32.py rebuilding
the weights. tests/test_ds_peer.py holds the same layout against the real DeepSpeed."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distributed import run_ranks
from minitron.runtime.checkpoint.pickles import load_state

IN, OUT, WORLD = 6, 3, 2
NEXT = (2, 3)   # the steps run after saving at global_step2
STAGES, PRECISIONS = (0, 1, 2, 3), ("fp32", "fp16", "bf16")
DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# The keys DeepSpeed 0.19.8 writes, in its order (read from files it wrote on gloo CPU ranks).
MODEL_KEYS = ["module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
              "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "skipped_steps",
              "global_steps", "global_samples", "dp_world_size", "mp_world_size",
              "checkpoint_parallel_dimensions", "ds_config", "ds_version"]
ZERO12_KEYS = ["loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad", "base_optimizer_state",
               "single_partition_of_fp32_groups", "zero_stage", "group_paddings", "param_alignment_paddings",
               "partition_count", "ds_version", "param_slice_mappings"]
ZERO3_KEYS = ["zero_stage", "loss_scaler", "dynamic_loss_scale", "overflow", "partition_count",
              "optimizer_state_dict", "fp32_flat_groups"]
# FP16_Optimizer's (DeepSpeed's default FusedAdam at 16 bits): the loss scale only in fp16.
STAGE0_16BIT_KEYS = ["optimizer_state_dict", "fp32_groups_flat", "clip_grad"]
FP16_SCALE_KEYS = ["dynamic_loss_scale", "cur_scale", "cur_iter", "last_overflow_iter", "scale_factor",
                   "scale_window"]
PARAMS = ["enc.weight", "enc.bias", "norm.weight", "norm.bias", "mid.weight", "mid.bias", "dec.bias", "head.weight",
          "head.bias"]


class TiedNet(torch.nn.Module):
    """Odd sizes (padding shows), one weight used by two layers, a persistent buffer and one
    that is not: everything a model-states file must account for."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.enc, self.norm = torch.nn.Linear(IN, 7), torch.nn.LayerNorm(7)
        self.mid, self.dec, self.head = torch.nn.Linear(7, 7), torch.nn.Linear(7, 7), torch.nn.Linear(7, OUT)
        self.dec.weight = self.mid.weight
        self.register_buffer("scale", torch.tensor(0.5))
        self.register_buffer("cache", torch.zeros(2), persistent=False)

    def forward(self, x):
        h = torch.tanh(self.mid(self.norm(self.enc(x))))
        return self.head(torch.tanh(self.dec(h)) * self.scale)


def ds_config(stage: int, precision: str, torch_adam: bool = False) -> dict:
    """The config both minitron and DeepSpeed run: Adam is DeepSpeed's FusedAdam unless
    ``torch_adam``, which asks for torch's AdamW (the two keep their state in other forms)."""
    config = {"train_batch_size": 4, "gradient_clipping": 1.0, "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.01, **({"torch_adam": True} if torch_adam else {})}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3, "warmup_max_lr": 0.01}}}
    if precision != "fp32":
        config[precision] = {"enabled": True}
    return config


def batch(step: int, rank: int, precision: str):
    g = torch.Generator().manual_seed(50 + step)
    x, y = torch.randn(4, IN, generator=g), torch.randn(4, OUT, generator=g)
    rows = slice(2 * rank, 2 * rank + 2)
    return x[rows].to(DTYPE[precision]), y[rows]


def train(engine, rank: int, precision: str, steps, out=None) -> list:
    """One micro-batch a step; the step's loss averaged over the ranks."""
    import torch.distributed as dist   # as the engine tests do: the rank's own process group
    losses = []
    for step in steps:
        x, y = batch(step, rank, precision)
        loss = torch.nn.functional.mse_loss(engine(x).float(), y)
        engine.backward(loss)
        engine.step()
        total = torch.tensor([loss.item()])
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
    return losses


def expected_files(stage: int, precision: str, tag: str) -> list:
    """DeepSpeed 0.19.8's file list for this run on two ranks."""
    prefix = "bf16_" if precision == "bf16" else ""
    model = ([f"{tag}/mp_rank_00_model_states.pt"] if stage < 3 else
             [f"{tag}/zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(WORLD)])
    if stage == 0:
        return sorted(["latest", *model])
    optim = [f"{tag}/{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(WORLD)]
    return sorted(["latest", "zero_to_fp32.py", "zero_to_torch.py", *model, *optim])


def files_under(root) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _save_and_resume(root: str):
    def body(rank):
        from minitron.runtime import initialize   # in the rank: the engine needs its process group
        out = {}
        for stage in STAGES:
            for precision in PRECISIONS:
                where = f"{root}/{stage}_{precision}"
                model = TiedNet()
                engine, *_ = initialize(model=model, config=ds_config(stage, precision))
                train(engine, rank, precision, range(2))
                engine.save_checkpoint(where, client_state={"epoch": 7})
                out[stage, precision] = {"next": train(engine, rank, precision, NEXT),
                                         **resume(where, stage, precision, rank)}
        return out
    return body


def resume(where: str, stage: int, precision: str, rank: int, torch_adam: bool = False) -> dict:
    """A fresh engine (other initial weights) loads ``where`` and runs the next two steps: the
    first one's loss shows the weights came back, the second's the moments and the schedule."""
    from minitron.runtime import initialize   # in the rank: the engine needs its process group
    fresh, *_ = initialize(model=TiedNet(seed=9), config=ds_config(stage, precision, torch_adam))
    path, client = fresh.load_checkpoint(where)
    return {"again": train(fresh, rank, precision, NEXT), "client": client, "path": path,
            "steps": fresh.global_steps}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds_layout")
    return root, run_ranks(_save_and_resume(str(root)), world_size=WORLD, tp=None)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("stage", STAGES)
def test_file_list_and_keys_are_deepspeeds(saved, stage, precision):
    root, _ = saved
    where = root / f"{stage}_{precision}"
    assert files_under(where) == expected_files(stage, precision, "global_step2")
    model_file = "mp_rank_00" if stage < 3 else "zero_pp_rank_1_mp_rank_00"
    state = torch.load(where / "global_step2" / f"{model_file}_model_states.pt", weights_only=False)
    assert list(state) == MODEL_KEYS + ["epoch"]   # the client state rides along, after DeepSpeed's keys
    assert state["ds_version"] == "0.19.8" and state["ds_config"] == ds_config(stage, precision)
    assert state["buffer_names"] == ["scale"] and state["global_steps"] == 2 and state["dp_world_size"] == WORLD
    assert state["checkpoint_parallel_dimensions"] == {"pp_degree": 1, "tp_degree": 1}
    if stage == 0:
        assert state["param_shapes"] is None and state["shared_params"] is None
        optimizer = state["optimizer"]
        if precision == "fp32":   # the Adam's own state dict (FusedAdam's), one entry per parameter
            assert list(optimizer) == ["state", "param_groups"] and len(optimizer["state"]) == 9
            assert optimizer["state"][0]["exp_avg"].shape == (7, IN) and optimizer["state"][8]["step"] == 2
            assert optimizer["param_groups"][0]["bias_correction"] is True
        else:                     # FP16_Optimizer's: one unpadded flat master a group
            assert list(optimizer) == (FP16_SCALE_KEYS if precision == "fp16" else []) + STAGE0_16BIT_KEYS
            assert optimizer["fp32_groups_flat"][0].shape == (150,)
            assert optimizer["optimizer_state_dict"]["state"][0]["exp_avg"].shape == (150,)
        return
    # Nine parameters: dec.weight is mid.weight, which the optimizer holds once, under its first name.
    assert list(state["param_shapes"][0]) == PARAMS
    assert state["param_shapes"][0]["enc.weight"] == (7, IN)
    assert state["frozen_param_shapes"] == ({} if stage >= 2 else None)
    if stage == 3:   # each rank has only pieces: the module's parameters are empty, buffers real
        assert state["module"]["enc.weight"].numel() == 0 and state["module"]["scale"] == 0.5
    rank0 = "mp_rank_00" if stage < 3 else "zero_pp_rank_0_mp_rank_00"
    rank0 = torch.load(where / "global_step2" / f"{rank0}_model_states.pt", weights_only=False)
    assert rank0["shared_params"] == {"dec.weight": "mid.weight"}
    prefix = "bf16_" if precision == "bf16" else ""
    # DeepSpeed's loss-scaler object is in it: read through minitron's stand-ins, as DeepSpeed is absent
    optim = load_state(where / "global_step2" / f"{prefix}zero_pp_rank_1_mp_rank_00_optim_states.pt")
    assert list(optim) == ["optimizer_state_dict", "ds_config", "ds_version"]
    inner = optim["optimizer_state_dict"]
    assert list(inner) == (ZERO3_KEYS if stage == 3 else ZERO12_KEYS) and inner["zero_stage"] == stage
    if stage < 3:   # 150 elements, padded to 152 (a multiple of 2 x dp): 76 a rank, rank 1's last 2 cut off
        assert inner["single_partition_of_fp32_groups"][0].numel() == 74 and inner["group_paddings"] == [2]
        assert sum(m.numel for m in inner["param_slice_mappings"][0].values()) == 74
    else:           # every parameter cut on its own, ceil(numel / 2) a rank, padding kept
        assert inner["fp32_flat_groups"][0].numel() == 21 + 4 + 4 + 4 + 25 + 4 + 4 + 11 + 2


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("stage", STAGES)
def test_round_trip_repeats_the_next_two_steps_exactly(saved, stage, precision):
    root, results = saved
    for out in results:
        got = out[stage, precision]
        assert got["again"] == got["next"]   # exactly, not approximately
        assert got["client"] == {"epoch": 7} and got["steps"] == 4   # two loaded, two more run
        assert got["path"] == str(root / f"{stage}_{precision}" / "global_step2")


def _run_copied_script(script: Path, *argv: str) -> tuple[int, str]:
    """A recovery script as `python SCRIPT ARGV` runs it, but in this process (which has paid
    for torch already: five fresh interpreters were ~10 s of the suite's CPU). Its folder
    leads sys.path, as for a script, so the copy beside it is the sibling it imports."""
    import contextlib
    import io
    import runpy

    err, code = io.StringIO(), 0
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv, sys.path[:0] = [str(script), *argv], [str(script.parent)]
    sys.modules.pop("zero_to_fp32", None)   # the sibling of this copy, not of the last one
    try:
        with contextlib.redirect_stderr(err):
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        sys.modules.pop("zero_to_fp32", None)
    return code, err.getvalue()


def test_recovery_script_rebuilds_the_weights(saved, tmp_path):
    """The copied zero_to_fp32.py, run as a script, gives back the weights the engine saved, and
    zero_to_torch.py the same in bf16; a folder that is not a checkpoint gets one line and exit
    code 2. One of them runs as a fresh interpreter would, the rest in this process."""
    root, _ = saved
    rebuilt = {}
    for stage in (1, 2, 3):
        where, out = root / f"{stage}_fp32", tmp_path / f"{stage}.pt"
        code, stderr = _run_copied_script(where / "zero_to_fp32.py", str(where), str(out))
        assert code == 0, stderr
        rebuilt[stage] = torch.load(out)
        assert sorted(rebuilt[stage]) == sorted(PARAMS + ["dec.weight", "scale"])
        assert torch.equal(rebuilt[stage]["dec.weight"], rebuilt[stage]["mid.weight"])
    # fp32 at stages 1-2 the module file holds the very weights the masters are.
    module = torch.load(root / "1_fp32" / "global_step2" / "mp_rank_00_model_states.pt", weights_only=False)
    for name, tensor in module["module"].items():
        assert torch.equal(rebuilt[1][name], tensor), name
    for name, tensor in rebuilt[1].items():   # the same two steps, partitioned three ways
        assert torch.allclose(rebuilt[2][name], tensor, atol=1e-6) and torch.allclose(
            rebuilt[3][name], tensor, atol=1e-6), name
    # zero_to_torch.py: the same weights in the dtype asked for; a real interpreter, run from
    # the checkpoint folder, so its sibling import is the copy's.
    done = subprocess.run([sys.executable, str(root / "3_fp32" / "zero_to_torch.py"), str(root / "3_fp32"),
                           str(tmp_path / "bf16.pt"), "--dtype", "bf16"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for name, tensor in torch.load(tmp_path / "bf16.pt").items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, rebuilt[3][name].bfloat16()), name
    code, stderr = _run_copied_script(root / "1_fp32" / "zero_to_fp32.py", str(tmp_path), "x.pt", "--tag", ".")
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "no *mp_rank_00_model_states.pt" in stderr


def _refusals(root: str):
    def body(rank):
        from minitron.runtime import initialize   # in the rank: the engine needs its process group
        engine, *_ = initialize(model=TiedNet(), config=ds_config(1, "fp32"))
        engine.save_checkpoint(f"{root}/stage1")
        if rank == 0:   # what minitron wrote before: DeepSpeed's file names, not its keys
            (Path(root) / "old" / "old").mkdir(parents=True)
            torch.save({"module": engine.module.state_dict(), "dp_world_size": WORLD, "zero_stage": 1},
                       Path(root) / "old" / "old" / "mp_rank_00_model_states.pt")
            (Path(root) / "old" / "latest").write_text("old")
        torch.distributed.barrier()
        said = []
        for where, stage, precision in (("old", 1, "fp32"), ("stage1", 0, "fp32"), ("stage1", 3, "fp32"),
                                        ("stage1", 1, "bf16"), ("stage1", 2, "fp32")):
            other, *_ = initialize(model=TiedNet(), config=ds_config(stage, precision))
            try:
                other.load_checkpoint(f"{root}/{where}")
                said.append("loaded")
            except ValueError as refusal:
                said.append(str(refusal))
        return said
    return body


def test_what_cannot_load_is_refused_in_one_line(tmp_path):
    """minitron's old layout, and a checkpoint loaded at another stage or precision."""
    for said in run_ranks(_refusals(str(tmp_path)), world_size=WORLD, tp=None):
        assert all("\n" not in line for line in said), said
        old, to_stage0, to_stage3, to_bf16, to_stage2 = said
        assert "minitron's layout from before it wrote DeepSpeed's" in old
        assert "saved at a ZeRO stage above 0 and this run has stage 0" in to_stage0
        assert "no zero_pp_rank_" in to_stage3 and "load with the ZeRO stage, precision" in to_stage3
        assert "no bf16_zero_pp_rank_" in to_bf16
        assert "saved at ZeRO stage 1 with 2 partitions; this run has stage 2" in to_stage2


def _tensor_parallel(root: str):
    """Tensor parallel 2 x data parallel 2, Megatron's parallel_state as the mpu."""
    def body(rank):
        from minitron.core import parallel_state as ps   # in the rank: its groups are built there
        from minitron.runtime import initialize          # in the rank: the engine needs its process group
        dp_rank = ps.get_data_parallel_rank()
        engine, *_ = initialize(model=TiedNet(), mpu=ps, config=ds_config(1, "fp32"))
        train(engine, dp_rank, "fp32", range(2))
        engine.save_checkpoint(root)
        next_losses = train(engine, dp_rank, "fp32", NEXT)
        fresh, *_ = initialize(model=TiedNet(seed=9), mpu=ps, config=ds_config(1, "fp32"))
        fresh.load_checkpoint(root)
        return next_losses, train(fresh, dp_rank, "fp32", NEXT)
    return body


def test_tensor_parallel_ranks_write_their_own_files(tmp_path):
    """Each tensor rank writes its model file (mp_rank_01 beside mp_rank_00) and its data-parallel
    ranks their partitions, named by data-parallel rank; each reads its own back."""
    for before, after in run_ranks(_tensor_parallel(str(tmp_path)), world_size=4, tp=2):
        assert after == before
    assert files_under(tmp_path) == sorted(
        ["latest", "zero_to_fp32.py", "zero_to_torch.py"]
        + [f"global_step2/mp_rank_0{mp}_model_states.pt" for mp in (0, 1)]
        + [f"global_step2/zero_pp_rank_{dp}_mp_rank_0{mp}_optim_states.pt" for dp in (0, 1) for mp in (0, 1)])
    state = torch.load(tmp_path / "global_step2" / "mp_rank_01_model_states.pt", weights_only=False)
    assert state["mp_world_size"] == 2 and state["checkpoint_parallel_dimensions"] == {"pp_degree": 1,
                                                                                        "tp_degree": 2}
