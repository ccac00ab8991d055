"""One torch_dist checkpoint, read by other layouts: what each rank reads, counted.

    python scripts/show_ckpt_layouts.py --layer   # layer 0's sharded state dict on tp ranks 0 and 1
    python scripts/show_ckpt_layouts.py           # saved at tp 2 x pp 2; bytes each rank of
                                                  # tp 1 x pp 2 and of tp 4 x pp 1 reads, per file
    python scripts/show_ckpt_layouts.py --svg     # the same as a picture (stdout)
    python scripts/show_ckpt_layouts.py --svg-out reads.svg   # the table, and the picture
                                                  # written to reads.svg, from the same runs

A small GPT (4 layers, SwiGLU) is saved by 4 forked gloo ranks at tp 2 x pp 2, then loaded
at each other layout by as many ranks; every rank reports DCP's plan: which stored chunks it
read, from which file (``__<writing rank>_0.distcp``). Nothing is estimated.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

SAVED = (2, 2)                     # tp, pp of the writing layout
READERS = [(1, 2), (4, 1)]         # tp, pp of the layouts that read it


def _gpt(tp: int, pp: int):
    """On a rank with its groups set up: the small GPT, this rank's stage of it."""
    import torch

    from minitron.core import parallel_state
    from minitron.core.models.gpt import GPTModel
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.core.transformer import TransformerConfig

    torch.set_num_threads(1)
    config = TransformerConfig(num_layers=4, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                               gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                               tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, init_seed=1)
    model_parallel_cuda_manual_seed(1)
    return GPTModel(config, 64, 8, pre_process=parallel_state.is_pipeline_first_stage(),
                    post_process=parallel_state.is_pipeline_last_stage())


# What every rank imports, imported once in the parent that forks them: the 12 ranks of the
# table each importing the model and DCP (and compiling them, with no bytecode cache) cost 0.55 s
# of CPU more.
MODEL_IMPORTS = ("torch._dynamo", "minitron.core.models.gpt")
DCP_IMPORTS = ("minitron.core.dist_checkpointing", "torch.distributed.checkpoint")


def on_ranks(tp: int, pp: int, body, imports: tuple[str, ...] = MODEL_IMPORTS) -> list:
    """``body(rank)`` on tp * pp forked gloo ranks with Megatron's groups for (tp, pp)."""
    from minitron.core import parallel_state
    from minitron.launcher import LaunchConfig, run_on_ranks, session_env

    def with_groups(rank: int):
        parallel_state.initialize_model_parallel(tp, pp)
        try:
            return body(rank)
        finally:
            parallel_state.destroy_model_parallel()
    return run_on_ranks(with_groups, LaunchConfig(world_size=tp * pp, env=session_env(tp * pp, None), warm=imports))


def describe(sh) -> dict:
    """A ShardedTensor (or the chunks a factory builds) as plain values."""
    from minitron.core.dist_checkpointing.mapping import ShardedTensorFactory

    pieces = sh.build() if isinstance(sh, ShardedTensorFactory) else [sh]
    return {"key": sh.key, "pieces": [{"local": list(p.local_shape), "global": list(p.global_shape),
                                       "offset": list(p.global_offset), "replica": list(p.replica_id)}
                                      for p in pieces]}


def layer_table(where: Path) -> str:
    tp, pp = SAVED

    def body(rank):
        sharded = _gpt(tp, pp).sharded_state_dict()
        return {k: describe(v) for k, v in sharded.items() if k.startswith("decoder.layers.0.")} if rank < tp else None
    lines = []
    for rank, entries in enumerate(on_ranks(tp, pp, body)[:tp]):
        lines.append(f"tp rank {rank} (stage 0): decoder.layers.<key>  local shape -> global shape @ offset  "
                     f"replica id")
        for path, entry in entries.items():
            for piece in entry["pieces"]:
                local, whole = str(tuple(piece["local"])), str(tuple(piece["global"]))
                shapes = f"{local:>8} -> {whole:13} @ {tuple(piece['offset'])}"
                key = entry["key"].removeprefix("decoder.layers.")
                lines.append(f"  {key:44} {shapes:42} {tuple(piece['replica'])}")
    return "\n".join(lines)


def reads(where: Path) -> dict[str, dict[str, int]]:
    """'tp T x pp P rank R' -> {file: bytes} for each reading layout's ranks."""
    from minitron.core import dist_checkpointing

    def save(rank):
        dist_checkpointing.save(_gpt(*SAVED).sharded_state_dict(), where)
    on_ranks(*SAVED, save, MODEL_IMPORTS + DCP_IMPORTS)
    rows = {}
    for tp, pp in READERS:
        def load(rank, tp=tp, pp=pp):
            read: dict[str, int] = {}
            dist_checkpointing.load(_gpt(tp, pp).sharded_state_dict(), where, bytes_read=read)
            return read
        for rank, read in enumerate(on_ranks(tp, pp, load, MODEL_IMPORTS + DCP_IMPORTS)):
            rows[f"tp{tp}·pp{pp} r{rank}"] = dict(sorted(read.items()))
    return rows


def picture(rows: dict[str, dict[str, int]]) -> str:
    """The bytes each reading rank reads, one bar per rank, split by the file's writer (SVG)."""
    from minitron.cli.views.svg_curves import bars_svg

    named = {row: {f"written by rank {f.split('_')[2]}": n for f, n in files.items()}
             for row, files in rows.items()}
    return bars_svg(named, heading=f"bytes each rank reads of one tp {SAVED[0]} × pp {SAVED[1]} checkpoint")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", action="store_true", help="print layer 0's sharded state dict")
    parser.add_argument("--svg", action="store_true", help="print the bytes read as an SVG picture")
    parser.add_argument("--json", action="store_true", help="print the bytes read as JSON")
    # The chapter shows the table and the picture: one set of 12 ranks for both, not two.
    parser.add_argument("--svg-out", type=Path, metavar="FILE", help="also write the picture to FILE")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        if options.layer:
            print(layer_table(where))
            return
        rows = reads(where)
        stored = sum(p.stat().st_size for p in where.glob("__*_0.distcp"))
    if options.svg_out:
        options.svg_out.write_text(picture(rows) + "\n")
    if options.json:
        print(json.dumps(rows))
    elif options.svg:
        print(picture(rows))
    else:
        print(f"saved at tp {SAVED[0]} x pp {SAVED[1]}: {stored:,} bytes in 4 .distcp files")
        for row, files in rows.items():
            said = ", ".join(f"{f} {n:,}" for f, n in files.items())
            print(f"{row:12} reads {sum(files.values()):>7,} bytes: {said}")


if __name__ == "__main__":
    sys.exit(main())
