"""`minitron ckpt convert SRC DST --ckpt-format torch|torch_dist`: Megatron's conversion, with
the model's flags read back from SRC.

Megatron converts by running pretrain with --load SRC --ckpt-convert-format F
--ckpt-convert-save D: the run loads what it can read (a legacy checkpoint only at its own
layout) and saves it again as D/F. That run needs every flag of the model; the checkpoint
already holds them (the saved args), so this command turns each saved value that differs from
Megatron's default back into its flag and runs the conversion on as many ranks as wrote SRC.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

from minitron.cli.common import UserError, console, validate_pretrain
from minitron.cli.views.words import plural

# Flags a conversion must not inherit from the run that saved: where it wrote, how it logged,
# and the derived values Megatron's validate_args sets itself.
NOT_INHERITED = {"save", "load", "ckpt_format", "ckpt_convert_format", "ckpt_convert_save", "log_jsonl",
                 "tensorboard_dir", "wandb_project", "exit_interval", "rank", "world_size", "local_rank",
                 "global_batch_size", "distributed_backend"}


def saved_flags(values: dict) -> list[str]:
    """Megatron's command line that sets ``values`` (a saved args dict): a flag per value that
    differs from the parser's default, so a user need not repeat the model's flags."""
    return [word for unit in saved_units(values) for word in unit]


def without_implied(units: list[list[str]], rest: list[str], world: int) -> list[list[str]]:
    """Leave out each flag that validate_args would set to the same value anyway (the padded
    vocabulary, the expert tensor-parallel size equal to tp, a qkv bias that the linear biases
    imply): the command printed is the one a user would have typed, and runs the same."""
    def validated(kept):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return vars(validate_pretrain([w for unit in kept for w in unit] + rest, world))

    whole = validated(units)
    kept = list(units)
    for unit in units:
        trial = [u for u in kept if u is not unit]
        try:
            same = validated(trial) == whole
        except UserError:
            same = False
        if same:
            kept = trial
    return kept


def saved_units(values: dict) -> list[list[str]]:
    """saved_flags' flags, each with its values."""
    # lazy: only the commands that rebuild a run's flags load Megatron's parser
    from minitron.training.arguments import megatron_parser

    units = []
    for action in megatron_parser()._actions:
        if not action.option_strings or action.dest not in values or action.dest in NOT_INHERITED:
            continue
        value, flag = values[action.dest], action.option_strings[0]
        if value == action.default or value is None:
            continue
        if action.dest.startswith("moe_") and not values.get("num_experts"):
            continue   # validate_args fills MoE values in for every model; a dense one refuses them as flags
        if action.nargs == 0:   # store_true / store_false: present means "not the default"
            units.append([flag])
        elif isinstance(value, list):
            units.append([flag, *map(str, value)])
        else:
            units.append([flag, str(value)])
    return units


def convert(source: Path, dest: Path | None, ckpt_format: str | None) -> None:
    """Megatron's conversion (pretrain --load SRC --ckpt-convert-format F --ckpt-convert-save D),
    on as many ranks as wrote SRC, with SRC's own saved flags."""
    if dest is None or ckpt_format is None:
        raise UserError("minitron ckpt convert SRC DST --ckpt-format torch|torch_dist: give both directories "
                        "and the format to write")
    if ckpt_format not in ("torch", "torch_dist"):
        raise UserError(f"--ckpt-format {ckpt_format}: convert writes torch (one file per tp/pp rank) or "
                        f"torch_dist (Megatron's sharded format)")
    work = dest.with_name(dest.name + ".converting")   # Megatron's --ckpt-convert-save: DST appears whole
    for path in (dest, work):
        if path.exists():
            raise UserError(f"{path} exists: convert writes a new directory; remove it or name another DST")
    # lazy: the checks above need neither torch nor the launcher
    from minitron.training.checkpoint_files import (
        CheckpointError, iteration_dir, rank_dir, read_latest_iteration, read_metadata,
    )

    try:
        iteration = read_latest_iteration(source) if source.is_dir() else None
        if iteration is None:
            raise UserError(f"{source} holds no checkpoint (no latest_checkpointed_iteration.txt): give the "
                            f"directory a --save wrote")
        meta = read_metadata(source, iteration)
    except CheckpointError as exc:
        raise UserError(str(exc).splitlines()[0]) from None
    have = "torch_dist" if meta.get("sharded_backend") == "torch_dist" else "torch"
    if have == ckpt_format:
        raise UserError(f"{source} is a --ckpt-format {have} checkpoint already: convert to the other format")
    import torch  # lazy: the saved flags are in common.pt / the shards, torch files

    where = iteration_dir(source, iteration)
    saved = where / "common.pt" if have == "torch_dist" else rank_dir(
        source, iteration, 0, 0, meta.get("pipeline_model_parallel_size", 1)) / "model_optim_rng.pt"
    args = torch.load(saved, map_location="cpu", weights_only=True)["args"]
    # The conversion trains nothing, and its batch size is not the saved run's (global batch is
    # not inherited), so its learning-rate schedule would differ from the checkpoint's, which
    # Megatron's load refuses: the scheduler is carried over from the checkpoint as it is.
    rest = ["--load", str(source), "--ckpt-format", have, "--ckpt-convert-format", ckpt_format,
            "--ckpt-convert-save", str(work), "--use-checkpoint-opt_param-scheduler"]
    world = meta.get("world_size", args["world_size"])
    argv = [w for unit in without_implied(saved_units(args), rest, world) for w in unit] + rest
    validate_pretrain(argv, world)
    from minitron.launcher import LaunchConfig, RankFailure, Target, launch   # lazy, as above

    console.print(f"converting {source} (iteration {iteration}, {have}) on {plural(world, 'rank')}: "
                  f"minitron pretrain --world {world} {' '.join(argv)}", highlight=False, soft_wrap=True)
    try:
        launch(LaunchConfig(world_size=world, log_dir=work / "logs"), Target(module="minitron.pretrain_gpt", argv=argv))
    except RankFailure as exc:
        raise UserError(f"the conversion failed: {exc}") from None
    (work / ckpt_format).rename(dest)   # Megatron writes D/<format>; the user asked for DST itself
    shutil.rmtree(work)                  # the ranks' logs: kept only when a rank failed
    console.print(f"wrote {dest} ({ckpt_format}, iteration {iteration})", highlight=False)
