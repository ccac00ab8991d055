"""`minitron ckpt inspect DIR [--tp T --pp P --dp D]`: what a torch_dist checkpoint holds, who
wrote each piece and, given another layout, what each of its ranks will read; `minitron ckpt
convert SRC DST --ckpt-format F`: Megatron's conversion, run with the flags saved in SRC.

A torch_dist checkpoint (--ckpt-format torch_dist) is one set of global tensors, each cut into
the chunks the writing layout held: ``decoder.layers.mlp.linear_fc1.weight`` of shape
(layers, 2·ffn, h) arrives as tp × pp chunks from a tp × pp layout, and any other layout reads
the byte ranges its own pieces overlap. This command prints, per tensor, its global shape and
each chunk's place, the file it is in and the rank (with its tp / pp / dp coordinates in the
writing layout) that wrote it. The checkpoint is checked first as a resume would check it
(checksums, DCP's metadata through a reader that admits only its own classes).

With a target layout (--tp/--pp/--dp...), the layout is validated as `pretrain` would validate
it with the model's saved flags, then views/ckpt_plan.py predicts each rank's reads from the
metadata alone: nothing is built, nothing is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from minitron.cli.common import UserError, app, console, validate_pretrain
from minitron.cli.views.fitted_table import print_fitted
from minitron.cli.views.words import plural


def _iteration_dir(directory: Path, first=None) -> tuple[Path, dict]:
    """DIR is a --save directory (its latest iteration is read) or one iteration's directory.
    ``first(meta)``, if given, runs on metadata.json before the files are checked (torch reads
    DCP's metadata): what can be refused from the JSON alone is refused without torch."""
    # lazy, as every reader here: `minitron --help` imports this module
    from minitron.training.checkpoint_files import (
        CheckpointError, check_sharded_files, iteration_dir, read_latest_iteration, read_metadata,
    )

    if not directory.is_dir():
        raise UserError(f"{directory} is not a directory: give a --save directory or one iter_* inside it")
    try:
        if (directory / ".metadata").exists():   # one iteration, or a bare dist_checkpointing.save
            meta = json.loads((directory / "metadata.json").read_text())
            if first is not None:
                first(meta)
            if "files" in meta:
                check_sharded_files(directory.parent, meta["iteration"], meta)
            return directory, meta
        iteration = read_latest_iteration(directory)
        if iteration is None:
            raise UserError(f"{directory} holds no checkpoint (no latest_checkpointed_iteration.txt and no "
                            f".metadata): give a --save directory or one iter_* inside it")
        meta = read_metadata(directory, iteration)
        if meta.get("sharded_backend") != "torch_dist":
            raise UserError(f"{iteration_dir(directory, iteration)} is a --ckpt-format torch checkpoint (one file "
                            f"per tp/pp rank); inspect reads torch_dist checkpoints")
        if first is not None:
            first(meta)
        check_sharded_files(directory, iteration, meta)
    except (CheckpointError, ValueError, OSError) as exc:
        raise UserError(str(exc).splitlines()[0]) from None
    return iteration_dir(directory, iteration), meta


def writer_coordinates(rank: int, meta: dict) -> str:
    """tp / pp / dp of a global rank in Megatron's default order (tp fastest, then dp, then pp)."""
    if "tensor_model_parallel_size" not in meta:
        return "layout not recorded"
    tp, dp = meta.get("tensor_model_parallel_size", 1), meta.get("data_parallel_size", 1)
    return f"tp{rank % tp} pp{rank // (tp * dp)} dp{rank // tp % dp}"


def chunk_rows(where: Path, meta: dict, match: str) -> list[list[str]]:
    # lazy: DCP's metadata needs torch, which `minitron --help` should not import
    from minitron.core.dist_checkpointing.serialization import read_dcp_metadata

    dcp_meta = read_dcp_metadata(where)
    rows = []
    for index, info in sorted(dcp_meta.storage_data.items(), key=lambda kv: (kv[0].fqn, tuple(kv[0].offset or ()))):
        if not index.fqn.startswith(match) or index.offset is None:
            continue
        md = dcp_meta.state_dict_metadata[index.fqn]
        size = next(c.sizes for c in md.chunks if c.offsets == index.offset)
        rank = int(info.relative_path.split("_")[2])
        rows.append([index.fqn, "×".join(map(str, md.size)), ",".join(map(str, index.offset)),
                     "×".join(map(str, size)), info.relative_path, f"{rank} ({writer_coordinates(rank, meta)})",
                     f"{info.length:,}"])
    return rows


# Flags a conversion must not inherit from the run that saved: where it wrote, how it logged,
# and the derived values Megatron's validate_args sets itself.
NOT_INHERITED = {"save", "load", "ckpt_format", "ckpt_convert_format", "ckpt_convert_save", "log_jsonl",
                 "tensorboard_dir", "wandb_project", "exit_interval", "rank", "world_size", "local_rank",
                 "global_batch_size", "distributed_backend"}


def saved_flags(values: dict) -> list[str]:
    """Megatron's command line that sets ``values`` (a saved args dict): a flag per value that
    differs from the parser's default, so a user need not repeat the model's flags."""
    # lazy: only the commands that rebuild a run's flags load Megatron's parser
    from minitron.training.arguments import megatron_parser

    argv = []
    for action in megatron_parser()._actions:
        if not action.option_strings or action.dest not in values or action.dest in NOT_INHERITED:
            continue
        value, flag = values[action.dest], action.option_strings[0]
        if value == action.default or value is None:
            continue
        if action.dest.startswith("moe_") and not values.get("num_experts"):
            continue   # validate_args fills MoE values in for every model; a dense one refuses them as flags
        if action.nargs == 0:   # store_true / store_false: present means "not the default"
            argv.append(flag)
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def target_args(meta: dict, tp: int, pp: int, dp: int, ep: int, vp: int | None, distributed: bool):
    """The target layout with the checkpoint's model, validated as `pretrain` would validate it
    (one line, before anything starts). The model's shape comes from metadata.json, so a layout
    that does not divide it is refused without reading the tensors (or importing torch)."""
    # lazy: validation needs Megatron's parser; `minitron --help` does not
    from minitron.training.checkpoint_files import LAYOUT_KEYS, RESHARDABLE

    model = {k: meta[k] for k in LAYOUT_KEYS if k in meta and k not in RESHARDABLE and k != "tokenizer_type"}
    argv = saved_flags(model) + ["--micro-batch-size", "1", "--mock-data",
                                 "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
                                 "--expert-model-parallel-size", str(ep)]
    if model.get("vocab_size") is None:
        argv += ["--vocab-size", "128"]   # a file tokenizer's size is not in metadata.json; padding only
    if vp is not None:
        argv += ["--virtual-pipeline-model-parallel-size", str(vp)]
    if distributed:
        argv.append("--use-distributed-optimizer")
    return validate_pretrain(argv, tp * pp * dp)


def inspect_chunks(where: Path, meta: dict, match: str) -> None:
    rows = chunk_rows(where, meta, match)
    if not rows:
        raise UserError(f"no tensor key in {where} starts with {match!r}")
    print_fitted(console, "chunks", ["key", "global shape", "offset", "chunk", "file", "written by", "bytes"], rows,
                 justify={2: "left", 3: "left", 4: "left", 5: "left"})
    files = sorted(where.glob("__*_*.distcp"))
    tensors = plural(len({r[0] for r in rows}), "tensor")
    console.print(f"{plural(len(rows), 'chunk')} of {tensors} shown; the checkpoint's "
                  f"{len(files)} .distcp files hold {sum(f.stat().st_size for f in files):,} bytes", highlight=False)


def convert(source: Path, dest: Path | None, ckpt_format: str | None) -> None:
    """Megatron's conversion (pretrain --load SRC --ckpt-convert-format F --ckpt-convert-save D),
    on as many ranks as wrote SRC, with SRC's own saved flags."""
    if dest is None or ckpt_format is None:
        raise UserError("minitron ckpt convert SRC DST --ckpt-format torch|torch_dist: give both directories "
                        "and the format to write")
    if ckpt_format not in ("torch", "torch_dist"):
        raise UserError(f"--ckpt-format {ckpt_format}: convert writes torch (one file per tp/pp rank) or "
                        f"torch_dist (Megatron's sharded format)")
    if dest.exists():
        raise UserError(f"{dest} exists: convert writes a new directory; remove it or name another")
    # lazy: the checks above need neither torch nor the launcher
    from minitron.training.checkpoint_files import CheckpointError, read_latest_iteration, read_metadata

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

    from minitron.training.checkpoint_files import iteration_dir, rank_dir
    where = iteration_dir(source, iteration)
    saved = where / "common.pt" if have == "torch_dist" else rank_dir(
        source, iteration, 0, 0, meta.get("pipeline_model_parallel_size", 1)) / "model_optim_rng.pt"
    args = torch.load(saved, map_location="cpu", weights_only=True)["args"]
    work = dest.with_name(dest.name + ".converting")
    argv = saved_flags(args) + ["--load", str(source), "--ckpt-format", have, "--ckpt-convert-format",
                                ckpt_format, "--ckpt-convert-save", str(work)]
    world = meta.get("world_size", args["world_size"])
    validate_pretrain(argv, world)
    from minitron.launcher import LaunchConfig, RankFailure, Target, launch   # lazy, as above

    console.print(f"converting {source} (iteration {iteration}, {have}) on {plural(world, 'rank')}: "
                  f"minitron pretrain --world {world} {' '.join(argv)}", highlight=False, soft_wrap=True)
    try:
        launch(LaunchConfig(world_size=world, log_dir=work / "logs"), Target(module="minitron.pretrain_gpt", argv=argv))
    except RankFailure as exc:
        raise UserError(f"the conversion failed: {exc}") from None
    (work / ckpt_format).rename(dest)   # Megatron writes D/<format>; the user asked for DST itself
    console.print(f"wrote {dest} ({ckpt_format}, iteration {iteration}); logs in {work / 'logs'}", highlight=False)


@app.command()
def ckpt(
    action: str = typer.Argument(..., metavar="inspect|convert", help="what to do"),
    directory: Path = typer.Argument(..., metavar="DIR|SRC", help="a --save directory (or one iter_* in it)"),
    dest: Path = typer.Argument(None, metavar="[DST]", help="convert: the new checkpoint's directory"),
    match: str = typer.Option("", "--match", help="only the tensors whose key starts with this text"),
    tp: int = typer.Option(None, "--tp", "--tensor-model-parallel-size", help="inspect: the target layout's tp"),
    pp: int = typer.Option(1, "--pp", "--pipeline-model-parallel-size", help="inspect: target pp"),
    dp: int = typer.Option(1, "--dp", help="inspect: target data-parallel size"),
    ep: int = typer.Option(1, "--ep", "--expert-model-parallel-size", help="inspect: target expert-parallel size"),
    vp: int = typer.Option(None, "--vp", "--virtual-pipeline-model-parallel-size", help="inspect: target vp"),
    distributed: bool = typer.Option(False, "--use-distributed-optimizer", help="inspect: the target's optimizer"),
    svg: Path = typer.Option(None, "--svg", help="inspect with a target: also draw the bytes per rank here"),
    ckpt_format: str = typer.Option(None, "--ckpt-format", help="convert: torch or torch_dist"),
):
    """Inspect a torch_dist checkpoint (each tensor's chunks and who wrote them; with --tp/--pp/--dp,
    what each rank of that layout will read), or convert a checkpoint to the other format."""
    if action == "convert":
        return convert(directory, dest, ckpt_format)
    if action != "inspect":
        raise UserError(f"minitron ckpt {action}: the action is inspect or convert (minitron ckpt inspect DIR)")
    if tp is not None or (pp, dp, ep, vp, distributed, svg) != (1, 1, 1, None, False, None):
        if not directory.is_dir():
            raise UserError(f"{directory} is not a directory: give a --save directory or one iter_* inside it")
        # lazy: the target's reads are drawn only when asked for
        from minitron.cli.views.ckpt_reads import inspect_target
        return inspect_target(directory, tp or 1, pp, dp, ep, vp, distributed, svg, match)
    where, meta = _iteration_dir(directory)
    layout = (f"tp {meta.get('tensor_model_parallel_size')} × pp {meta.get('pipeline_model_parallel_size')} × "
              f"dp {meta.get('data_parallel_size')}")
    if "iteration" in meta:
        console.print(f"{where}: iteration {meta['iteration']}, written by {meta.get('world_size')} ranks ({layout})",
                      highlight=False)
    inspect_chunks(where, meta, match)
