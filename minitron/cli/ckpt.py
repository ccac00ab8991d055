"""`minitron ckpt inspect DIR`: what a torch_dist checkpoint holds, and who wrote each piece.

A torch_dist checkpoint (--ckpt-format torch_dist) is one set of global tensors, each cut into
the chunks the writing layout held: ``decoder.layers.mlp.linear_fc1.weight`` of shape
(layers, 2·ffn, h) arrives as tp × pp chunks from a tp × pp layout, and any other layout reads
the byte ranges its own pieces overlap. This command prints, per tensor, its global shape and
each chunk's place, the file it is in and the rank (with its tp / pp / dp coordinates in the
writing layout) that wrote it. The checkpoint is checked first as a resume would check it
(checksums, DCP's metadata through a reader that admits only its own classes).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from minitron.cli.common import UserError, app, console
from minitron.cli.views.fitted_table import print_fitted
from minitron.cli.views.words import plural


def _iteration_dir(directory: Path) -> tuple[Path, dict]:
    """DIR is a --save directory (its latest iteration is read) or one iteration's directory."""
    # lazy, as every reader here: `minitron --help` imports this module
    from minitron.training.checkpoint_files import (
        CheckpointError, check_sharded_files, iteration_dir, read_latest_iteration, read_metadata,
    )

    if not directory.is_dir():
        raise UserError(f"{directory} is not a directory: give a --save directory or one iter_* inside it")
    try:
        if (directory / ".metadata").exists():   # one iteration, or a bare dist_checkpointing.save
            meta = json.loads((directory / "metadata.json").read_text())
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


@app.command()
def ckpt(
    action: str = typer.Argument(..., metavar="inspect", help="what to do: inspect"),
    directory: Path = typer.Argument(..., metavar="DIR", help="a --save directory or one iter_* in it"),
    match: str = typer.Option("", "--match", help="only the tensors whose key starts with this text"),
):
    """Inspect a torch_dist checkpoint: each tensor's global shape, its chunks, and which rank wrote each."""
    if action != "inspect":
        raise UserError(f"minitron ckpt {action}: the action is inspect (minitron ckpt inspect DIR)")
    where, meta = _iteration_dir(directory)
    layout = (f"tp {meta.get('tensor_model_parallel_size')} × pp {meta.get('pipeline_model_parallel_size')} × "
              f"dp {meta.get('data_parallel_size')}")
    if "iteration" in meta:
        console.print(f"{where}: iteration {meta['iteration']}, written by {meta.get('world_size')} ranks ({layout})",
                      highlight=False)
    rows = chunk_rows(where, meta, match)
    if not rows:
        raise UserError(f"no tensor key in {where} starts with {match!r}")
    print_fitted(console, "chunks", ["key", "global shape", "offset", "chunk", "file", "written by", "bytes"], rows,
                 justify={2: "left", 3: "left", 4: "left", 5: "left"})
    files = sorted(where.glob("__*_*.distcp"))
    tensors = plural(len({r[0] for r in rows}), "tensor")
    console.print(f"{plural(len(rows), 'chunk')} of {tensors} shown; the checkpoint's "
                  f"{len(files)} .distcp files hold {sum(f.stat().st_size for f in files):,} bytes", highlight=False)
