"""DeepSpeed's universal checkpoint (runtime/checkpoint/ds_to_universal.py, universal_checkpoint.py):
a ZeRO 1 and a ZeRO 3 checkpoint written by two data-parallel ranks are converted, and engines
of one and two ranks at other stages load them and run the next two steps with the losses of
the run that never stopped; the converter's files and its refusals.

Across data-parallel sizes the losses agree up to rounding, not bit for bit: one rank averages
the batch's gradient in one sum, two ranks in two halves and an all-reduce (the tolerance is
test_ds_peer.py's, for two engines started from one state).
"""

import contextlib
import io

import pytest
import torch

import minitron.runtime.engine  # noqa: F401  (imported here once, inherited by the forked ranks)
from distributed import run_ranks
from minitron.runtime.checkpoint import constants as C
from minitron.runtime.checkpoint.ds_to_universal import main as ds_to_universal
from test_ds_checkpoint import IN, OUT, PARAMS, TiedNet, ds_config

SOURCES = (1, 3)                  # the stages the two-rank run saves at
# (source stage, stage loaded at), by the number of ranks that load: every stage 0-3 loads
# from one rank or two, and from stages 1-2 (a lean partition a rank) and 3 (a piece of
# each parameter a rank), whose files differ.
PLAN = {1: [(1, 0), (1, 3), (3, 1)], 2: [(1, 2), (3, 0)]}
INFO = {C.UNIVERSAL_CHECKPOINT_INFO: {C.UNIVERSAL_CHECKPOINT_VERSION_KEY: C.UNIVERSAL_CHECKPOINT_VERSION_VALUE}}


def config(stage: int) -> dict:
    return {**ds_config(stage, "fp32"), "checkpoint": {"load_universal": True}}


def train(engine, steps) -> list:
    """The step's whole batch of 4, cut among the data-parallel ranks; its mean loss."""
    import torch.distributed as dist   # as the engine tests do: the rank's own process group
    world, rank, losses = dist.get_world_size(), dist.get_rank(), []
    for step in steps:
        g = torch.Generator().manual_seed(50 + step)
        x, y = torch.randn(4, IN, generator=g), torch.randn(4, OUT, generator=g)
        rows = slice(rank * 4 // world, (rank + 1) * 4 // world)
        loss = torch.nn.functional.mse_loss(engine(x[rows]), y[rows])
        engine.backward(loss)
        engine.step()
        total = torch.tensor([loss.item()])
        dist.all_reduce(total)
        losses.append(total.item() / world)
    return losses


def _save(root: str, then_load: list | None = None):
    """Save at each source stage and run on (the run that never stopped); with ``then_load``,
    rank 0 converts and the same ranks load the universal checkpoints as planned."""
    def body(rank):
        from minitron.runtime import initialize   # in the rank: the engine needs its process group
        out = {}
        for stage in SOURCES:
            engine, *_ = initialize(model=TiedNet(), config=ds_config(stage, "fp32"))
            train(engine, range(2))
            engine.save_checkpoint(f"{root}/{stage}", client_state=INFO)
            out[stage] = train(engine, (2, 3))
        if then_load is not None:
            if rank == 0:
                _convert_all(root)
            torch.distributed.barrier()
            out["loaded"] = _load(root, then_load)(rank)
        return out
    return body


def _convert_all(root: str) -> None:
    for stage in SOURCES:
        with contextlib.redirect_stdout(io.StringIO()):
            ds_to_universal(["--input_folder", f"{root}/{stage}/global_step2",
                             "--output_folder", f"{root}/uni{stage}/global_step2"])


def _load(root: str, plan: list):
    def body(rank):
        from minitron.runtime import initialize   # in the rank: the engine needs its process group
        out = {}
        for source, stage in plan:
            engine, *_ = initialize(model=TiedNet(seed=9), config=config(stage))
            path, client = engine.load_checkpoint(f"{root}/uni{source}")
            out[f"{source}->{stage}"] = {"losses": train(engine, (2, 3)), "steps": engine.global_steps,
                                         "client": sorted(client), "path": path}
        out["refused"] = []
        for where in ("1", "not_universal"):   # a plain checkpoint; a tag without zero/
            try:
                engine.load_checkpoint(f"{root}/{where}")
                out["refused"].append("loaded")
            except ValueError as refusal:
                out["refused"].append(str(refusal))
        return out
    return body


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("universal")
    (root / "not_universal" / "global_step2").mkdir(parents=True)
    (root / "not_universal" / C.LATEST_UNIVERSAL).write_text("global_step2")
    two = run_ranks(_save(str(root), PLAN[2]), world_size=2, tp=None)   # saves, converts, loads
    loaded = {1: run_ranks(_load(str(root), PLAN[1]), world_size=1, tp=None), 2: [r["loaded"] for r in two]}
    return root, {stage: two[0][stage] for stage in SOURCES}, loaded


def test_the_layout_is_deepspeeds(runs):
    root = runs[0]
    for stage in SOURCES:
        uni = root / f"uni{stage}"
        assert (uni / C.LATEST_UNIVERSAL).read_text() == "global_step2"
        tag = uni / "global_step2"
        models = ["mp_rank_00_model_states.pt"] if stage < 3 else [
            f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in (0, 1)]
        assert sorted(p.name for p in tag.iterdir()) == sorted(models + ["zero"])
        held = sorted(p.name for p in (tag / "zero").iterdir())
        # Stages 1-2 add what no partition held from the module: the tied name and the buffer.
        extra = ["dec.weight", "scale"] if stage < 3 else []
        assert held == sorted(PARAMS + extra + ["optimizer_state.pt"])
        states = sorted(p.name for p in (tag / "zero" / "enc.weight").iterdir())
        assert states == sorted(["fp32.pt", "exp_avg.pt", "exp_avg_sq.pt"] + (["step.pt"] if stage < 3 else []))
        fp32 = torch.load(tag / "zero" / "enc.weight" / "fp32.pt", weights_only=False)
        if stage < 3:   # whole, in the parameter's shape
            assert list(fp32) == ["cat_dim", "param"] and fp32["param"].shape == (7, IN)
            assert torch.load(tag / "zero" / "enc.weight" / "step.pt", weights_only=False) == 2
        else:           # DeepSpeed's stage-3 converter writes the bare flat tensor
            assert torch.is_tensor(fp32) and fp32.shape == (7 * IN,)


def test_another_size_and_stage_resumes_the_run(runs):
    root, full, loaded = runs
    for world, plan in PLAN.items():
        for rank in loaded[world]:
            for source, stage in plan:
                got = rank[f"{source}->{stage}"]
                assert got["losses"] == pytest.approx(full[source], rel=1e-6), (world, source, stage)
                assert got["steps"] == 4 and got["client"] == [C.UNIVERSAL_CHECKPOINT_INFO]
                assert got["path"] == str(root / f"uni{source}" / "global_step2")


def test_what_is_no_universal_checkpoint_is_refused_in_one_line(runs):
    for rank in runs[2][1]:
        plain, empty = rank["refused"]
        assert plain.startswith("no ") and C.LATEST_UNIVERSAL in plain and "ds_to_universal" in plain and "\n" not in plain
        assert "has no zero/ folder" in empty and "\n" not in empty


def _convert(*argv) -> tuple:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            ds_to_universal(list(argv))
            return 0, err.getvalue()
        except SystemExit as stop:
            return stop.code, err.getvalue()


def test_bad_input_is_one_line_and_exit_code_2(runs, tmp_path):
    root = runs[0]
    source = root / "1" / "global_step2"
    bare = tmp_path / "bare"
    bare.mkdir()
    cases = [((), "the following arguments are required"),
             (("--input_folder", str(tmp_path / "nowhere"), "--output_folder", str(tmp_path / "o")),
              "is not a folder"),
             (("--input_folder", str(bare), "--output_folder", str(tmp_path / "o")), "holds no *_optim_states.pt"),
             (("--input_folder", str(source), "--output_folder", str(source)), "is the --input_folder")]
    for argv, says in cases:
        code, stderr = _convert(*argv)
        assert code == 2 and says in stderr and len(stderr.strip().splitlines()) == 1, (argv, stderr)
