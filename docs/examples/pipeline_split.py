"""Which layers each pipeline rank builds, for pretrain's split flags (chapter 11).

    python docs/examples/pipeline_split.py --pipeline-model-parallel-size P [split flags] [--num-layers L ...]

The flags go through pretrain's own parser and validate_args (a tiny model shape fills in the
rest), so a split pretrain refuses is refused here in the same one line; the layers come from
the one function the model, the estimate and `ckpt inspect` share
(minitron/core/pipeline_parallel/layer_layout.py). One row per rank, one column per model chunk;
layer numbers are global and 1-based, as TransformerLayer.layer_number counts them.
"""

from __future__ import annotations

import sys

from minitron.core.pipeline_parallel.layer_layout import counts_from, parse_layout, stage_layers
from minitron.training.arguments import ArgumentError, build_parser, validate_args

TINY = ["--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "1",
        "--global-batch-size", "64", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
        "--distributed-backend", "gloo"]


def chunk_text(layers: range, stage: list[str]) -> str:
    """'E 1-3', '4-5', '61 m L': the stage's own symbols around its layers' numbers."""
    text = f"{layers.start + 1}-{layers.stop}" if len(layers) > 1 else f"{layers.stop}" if layers else ""
    cut = stage.index("t") if "t" in stage else len(stage)
    after = " ".join(s for s in stage[cut:] if s != "t")
    return " ".join(part for part in (" ".join(stage[:cut]), text, after) if part)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(TINY + argv)
    args.world_size, args.rank = args.pipeline_model_parallel_size, 0
    try:
        args = validate_args(args)
    except ArgumentError as exc:
        print(f"refused: {exc}")
        return 2
    pp, counts = args.pipeline_model_parallel_size, counts_from(args)
    chunks = len(counts) // pp
    # what a virtual stage holds: the layout says it; otherwise the embedding rides on the first
    # stage and the loss on the last
    if args.pipeline_model_parallel_layout:
        stages = parse_layout(args.pipeline_model_parallel_layout)
    else:
        stages = [["t"] * n for n in counts]
        stages[0].insert(0, "E")
        stages[-1].append("L")
    print(f"{args.num_layers} layers over pp {pp}" + (f" x {chunks} chunks" if chunks > 1 else "") +
          "  (E embedding, m MTP layer, L loss)")
    width = max(len(chunk_text(stage_layers(counts, pp, r, c), stages[c * pp + r]))
                for r in range(pp) for c in range(chunks)) + 2
    for rank in range(pp):
        cells = [chunk_text(stage_layers(counts, pp, rank, c), stages[c * pp + rank]).ljust(width)
                 for c in range(chunks)]
        layers = sum(len(stage_layers(counts, pp, rank, c)) for c in range(chunks))
        print(f"  rank {rank:>2}: " + "".join(cells) + f"({layers} layer{'s' * (layers != 1)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
