"""`minitron ckpt inspect DIR --tp T --pp P --dp D`: each rank of that layout and what it reads.

One row per rank (its tp / pp / dp place, the files it reads and how many bytes of each) or,
with --match KEY, one row per rank and tensor (which stored chunks, written by whom). The
bytes are predicted (views/ckpt_plan.py); ``--svg`` draws them as a bar per rank, a segment
per file read, like the picture chapter 18 draws from real loads.
"""

from __future__ import annotations

from pathlib import Path

from minitron.cli.ckpt import _iteration_dir, target_args, writer_coordinates
from minitron.cli.common import UserError, console
from minitron.cli.views.ckpt_plan import Target, plan_reads
from minitron.cli.views.fitted_table import print_fitted
from minitron.cli.views.words import plural


def _writer(path: str) -> str:
    """__3_0.distcp -> 3: the writing rank is in the file's name."""
    return path.split("_")[2]


def _chunks_by_writer(chunks) -> str:
    """'writer 0: 4 chunks, writer 1: 4 chunks': whose files the reads go to."""
    counts: dict[str, int] = {}
    for _, f, _ in chunks:
        counts[_writer(f)] = counts.get(_writer(f), 0) + 1
    return ", ".join(f"writer {w}: {plural(n, 'chunk')}" for w, n in counts.items())


def predicted_reads(directory: Path, target: Target, distributed: bool = False):
    """(iteration dir, metadata.json, plan): the target validated, then its reads predicted."""
    def validate(meta: dict) -> None:
        if "num_layers" not in meta:
            raise UserError(f"{directory}'s metadata.json does not record the model (num_layers ...): a bare "
                            f"dist_checkpointing.save; inspect with a target reads checkpoints a --save wrote")
        target_args(meta, target.tp, target.pp, target.dp, target.ep, target.vp, distributed)
    where, meta = _iteration_dir(directory, first=validate)
    # lazy: the saved args and DCP's metadata are torch files; refusals above come first
    from minitron.core.dist_checkpointing.serialization import load_common_state_dict, read_dcp_metadata

    args = load_common_state_dict(where)["args"]
    saved_grid = (meta["pipeline_model_parallel_size"], meta["tensor_model_parallel_size"], meta["data_parallel_size"])
    return where, meta, plan_reads(read_dcp_metadata(where), args, target, saved_grid)


def inspect_target(directory: Path, tp: int, pp: int, dp: int, ep: int, vp: int | None, distributed: bool,
                   svg: Path | None, match: str) -> None:
    target = Target(tp, pp, dp, vp, ep)
    where, meta, plan = predicted_reads(directory, target, distributed)
    files = sorted(where.glob("__*_*.distcp"))
    stored = sum(f.stat().st_size for f in files)
    written = (f"tp {meta['tensor_model_parallel_size']} × pp {meta['pipeline_model_parallel_size']} × "
               f"dp {meta['data_parallel_size']}")
    layout = f"tp {tp} × pp {pp} × dp {dp}" + (f" × ep {ep}" if ep > 1 else "") + (f", vp {vp}" if vp else "")
    console.print(f"{where}: written by {written} ({stored:,} bytes in {plural(len(files), 'file')}); "
                  f"read by {layout}, predicted from its metadata:", highlight=False)
    if match:
        rows = [[str(p["rank"]), writer_coordinates(p["rank"], meta | {"tensor_model_parallel_size": tp,
                                                                         "data_parallel_size": dp}),
                 key, _chunks_by_writer(chunks),
                 f"{sum(n for _, _, n in chunks):,}"]
                for p in plan for key, chunks in p["keys"].items() if key.startswith(match)]
        if not rows:
            raise UserError(f"no rank of {layout} reads a tensor whose key starts with {match!r}")
        print_fitted(console, "reads", ["rank", "place", "key", "stored chunks read", "bytes"],
                     rows, justify={1: "left", 3: "left"})
    else:
        rows = [[str(p["rank"]), writer_coordinates(p["rank"], {"tensor_model_parallel_size": tp,
                                                                "data_parallel_size": dp}),
                 ", ".join(f"{_writer(f)}: {n:,}" for f, n in p["files"].items()),
                 f"{sum(p['files'].values()):,}", f"{sum(p['files'].values()) / stored:.0%}"] for p in plan]
        print_fitted(console, "reads", ["rank", "place", "bytes from each writer's file", "bytes", "of all"],
                     rows, justify={1: "left", 2: "left"})
    if distributed:
        console.print("(the distributed optimizer changes nothing here: its state is stored shaped like the "
                      "parameters, and every data-parallel rank reads its parameters' whole slices)", highlight=False)
    if svg is not None:
        # lazy: the picture's module only when a picture is asked for
        from minitron.cli.views.svg_curves import bars_svg
        bars = {f"rank {p['rank']}": {f"written by rank {_writer(f)}": n for f, n in p["files"].items()}
                for p in plan}
        svg.write_text(bars_svg(bars, heading=f"bytes each rank of {layout} reads of one {written} checkpoint"))
        console.print(f"picture: {svg}", highlight=False)
