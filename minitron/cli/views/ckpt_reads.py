"""`minitron ckpt inspect DIR --tp T --pp P --dp D`: each rank of that layout and what it reads.

One row per rank (its tp / pp / dp place, the files it reads and how many bytes of each) or,
with --match KEY, one row per rank and tensor (which stored chunks, written by whom). The
bytes are predicted (views/ckpt_plan.py); ``--svg`` draws them as a bar per rank, a segment
per file read, like the picture chapter 18 draws from real loads.
"""

from __future__ import annotations

from pathlib import Path

from minitron.cli.views.ckpt_plan import Target
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


def show_reads(console, where: Path, meta: dict, plan: list[dict], target: Target, match: str,
               svg: Path | None) -> bool:
    """Print the plan (and draw it into ``svg``); False when --match names no tensor read."""
    tp, pp, dp, ep, vp = target.tp, target.pp, target.dp, target.ep, target.vp
    files = sorted(where.glob("__*_*.distcp"))
    stored = sum(f.stat().st_size for f in files)
    written = (f"tp {meta['tensor_model_parallel_size']} × pp {meta['pipeline_model_parallel_size']} × "
               f"dp {meta['data_parallel_size']}")
    layout = f"tp {tp} × pp {pp} × dp {dp}" + (f" × ep {ep}" if ep > 1 else "") + (f", vp {vp}" if vp else "")
    split = " ".join(target.split_flags())   # an uneven split, as pretrain's flags
    layout += f", {split}" if split else ""
    console.print(f"{where}: written by {written} ({stored:,} bytes in {plural(len(files), 'file')}); "
                  f"read by {layout}, predicted from its metadata:", highlight=False)
    def place(rank: int) -> str:
        tp_rank, pp_rank, dp_rank = target.coordinates(rank)
        return f"tp{tp_rank} pp{pp_rank}" + (f" dp{dp_rank}" if dp > 1 else "")
    if match:
        rows = [[key, str(p["rank"]), place(p["rank"]), _chunks_by_writer(chunks), f"{sum(n for _, _, n in chunks):,}"]
                for p in plan for key, chunks in p["keys"].items() if key.startswith(match)]
        if not rows:
            return False
        if len({r[0] for r in rows}) == 1:    # one tensor: name it once, above the table
            console.print(f"{rows[0][0]}:", highlight=False)
            rows = [r[1:] for r in rows]
        heads = ["rank", "place", "stored chunks read", "bytes"]
        print_fitted(console, "reads", heads if len(rows[0]) == 4 else ["key", *heads], rows,
                     justify={len(rows[0]) - 3: "left", len(rows[0]) - 2: "left"})
    else:
        rows = [[str(p["rank"]), place(p["rank"]), f"{sum(p['files'].values()):,} "
                 f"({sum(p['files'].values()) / stored:.0%})",
                 ", ".join(f"{_writer(f)}: {n:,}" for f, n in p["files"].items())] for p in plan]
        print_fitted(console, "reads", ["rank", "place", "bytes (of all)", "from each writer's file"], rows,
                     justify={1: "left", 3: "left"})
    if svg is not None:
        # lazy: the picture's module only when a picture is asked for
        from minitron.cli.views.svg_curves import bars_svg
        bars = {f"rank {p['rank']}": {f"written by rank {_writer(f)}": n for f, n in p["files"].items()}
                for p in plan}
        svg.write_text(bars_svg(bars, heading=f"bytes each rank of {layout} reads of one {written} checkpoint"))
        console.print(f"picture: {svg}", highlight=False)
    return True
