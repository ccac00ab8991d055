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
import shutil
from pathlib import Path

import typer

from minitron.cli.ckpt_convert import convert, saved_flags
from minitron.cli.common import UserError, app, console, validate_pretrain
from minitron.cli.views.ckpt_plan import Target, plan_reads
from minitron.cli.views.ckpt_reads import show_reads
from minitron.cli.views.fitted_table import print_fitted
from minitron.cli.views.words import plural


def _iteration_dir(directory: Path, first=None) -> tuple[Path, dict]:
    """DIR is a --save directory (its latest iteration is read) or one iteration's directory.
    ``first(meta)``, if given, runs on metadata.json before the files are checked (torch reads
    DCP's metadata): what can be refused from the JSON alone is refused without torch."""
    # lazy, as every reader here: `minitron --help` imports this module
    from minitron.training.checkpoint_files import (
        CheckpointError, iteration_dir, read_latest_iteration, read_metadata,
    )
    from minitron.training.checkpoint_files_dist import check_sharded_files

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
        if meta.get("sharded_backend") != "torch_dist":   # fsdp_dtensor's keys are Megatron-FSDP's, not torch_dist's
            kind = meta.get("sharded_backend") or "torch"
            raise UserError(f"{iteration_dir(directory, iteration)} is a --ckpt-format {kind} checkpoint"
                            f"{' (one file per tp/pp rank)' if kind == 'torch' else ''}; inspect reads torch_dist "
                            "checkpoints")
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


def target_args(meta: dict, tp: int, pp: int, dp: int, ep: int, vp: int | None, distributed: bool,
                split: list[str] = ()):
    """The target layout with the checkpoint's model, validated as `pretrain` would validate it
    (one line, before anything starts). The model's shape comes from metadata.json, so a layout
    that does not divide it is refused without reading the tensors (or importing torch)."""
    # lazy, as every reader here: `minitron --help` imports this module
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
    return validate_pretrain(argv + list(split), tp * pp * dp)   # split: an uneven target's own flags


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


def predicted_reads(directory: Path, target: Target, distributed: bool = False):
    """(iteration dir, metadata.json, plan): the target validated, then its reads predicted."""
    def validate(meta: dict) -> None:
        if "num_layers" not in meta:
            raise UserError(f"{directory}'s metadata.json does not record the model (num_layers ...): a bare "
                            f"dist_checkpointing.save; inspect with a target reads checkpoints a --save wrote")
        target_args(meta, target.tp, target.pp, target.dp, target.ep, target.vp, distributed, target.split_flags())
    where, meta = _iteration_dir(directory, first=validate)
    # lazy: the saved args and DCP's metadata are torch files; the refusals above come first
    from minitron.core.dist_checkpointing.serialization import load_common_state_dict, read_dcp_metadata

    args = load_common_state_dict(where)["args"]
    saved_grid = (meta["pipeline_model_parallel_size"], meta["tensor_model_parallel_size"], meta["data_parallel_size"])
    return where, meta, plan_reads(read_dcp_metadata(where), args, target, saved_grid)


def inspect_target(directory: Path, target: Target, distributed: bool, svg: Path | None, match: str) -> None:
    where, meta, plan = predicted_reads(directory, target, distributed)
    if not show_reads(console, where, meta, plan, target, match, svg):
        raise UserError(f"no rank of that layout reads a tensor whose key starts with {match!r}")
    if distributed:
        console.print("(the distributed optimizer changes nothing here: its state is stored shaped like the "
                      "parameters, and every data-parallel rank reads its parameters' whole slices)", highlight=False)


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
    first: int = typer.Option(None, "--decoder-first-pipeline-num-layers", help="inspect: the target's first stage"),
    last: int = typer.Option(None, "--decoder-last-pipeline-num-layers", help="inspect: the target's last stage"),
    layout: str = typer.Option(None, "--pipeline-model-parallel-layout", help="inspect: the target's stages"),
    ckpt_format: str = typer.Option(None, "--ckpt-format", help="convert: torch or torch_dist"),
):
    """Inspect a torch_dist checkpoint (each tensor's chunks and who wrote them; with --tp/--pp/--dp,
    what each rank of that layout will read), or convert a checkpoint to the other format."""
    if action == "convert":
        return convert(directory, dest, ckpt_format)
    if action != "inspect":
        raise UserError(f"minitron ckpt {action}: the action is inspect or convert (minitron ckpt inspect DIR)")
    if dest is not None or ckpt_format is not None:
        raise UserError("minitron ckpt inspect reads one checkpoint: DST and --ckpt-format belong to "
                        "minitron ckpt convert SRC DST --ckpt-format F")
    if tp is not None or (pp, dp, ep, vp, distributed, svg, first, last, layout) != (1, 1, 1, None, False, None,
                                                                                    None, None, None):
        if not directory.is_dir():
            raise UserError(f"{directory} is not a directory: give a --save directory or one iter_* inside it")
        target = Target(tp or 1, pp, dp, vp, ep, first=first, last=last, layout=layout)
        return inspect_target(directory, target, distributed, svg, match)
    where, meta = _iteration_dir(directory)
    layout = (f"tp {meta.get('tensor_model_parallel_size')} × pp {meta.get('pipeline_model_parallel_size')} × "
              f"dp {meta.get('data_parallel_size')}")
    if "iteration" in meta:
        console.print(f"{where}: iteration {meta['iteration']}, written by {meta.get('world_size')} ranks ({layout})",
                      highlight=False)
    inspect_chunks(where, meta, match)
