"""Build a small GPTModel on tensor-parallel ranks and print how each parameter is split.

    python scripts/tp_shapes.py --tp 2
    python scripts/tp_shapes.py --tp 4 --hidden-size 32 --num-attention-heads 8
    python scripts/tp_shapes.py --tp 1 --table-only     # the serial model's parameters

Every rank builds its part of the model (forked gloo ranks, as in training) and reports its
parameters' shapes; the table puts the ranks side by side, and the pictures draw the split
weights of one layer with their real sizes.
"""

from __future__ import annotations

import argparse
import os
import sys


def rank_shapes(args) -> list[dict]:
    """On one rank: build the model, list (name, local shape, how it is split)."""
    from minitron.core.models.gpt import GPTModel
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.training.tokenizer import _vocab_size_with_padding
    from minitron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads, ffn_hidden_size=args.ffn_hidden_size,
        tensor_model_parallel_size=args.tp, sequence_parallel=args.sequence_parallel,
        perform_initialization=False)  # shapes only: skip drawing the values
    model_parallel_cuda_manual_seed(1234)
    vocab = _vocab_size_with_padding(args.vocab_size, args.make_vocab_size_divisible_by, args.tp)
    model = GPTModel(config, vocab, args.seq_length,
                     share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights)
    return [{"name": name, "shape": list(p.shape),
             "dim": p.partition_dim if getattr(p, "tensor_model_parallel", False) else None,
             "sequence_parallel": bool(getattr(p, "sequence_parallel", False))}
            for name, p in model.named_parameters()]


def full_shape(entry: dict, tp: int) -> list[int]:
    shape = list(entry["shape"])
    if entry["dim"] is not None:
        shape[entry["dim"]] *= tp
    return shape


def how_split(entry: dict) -> str:
    name, dim = entry["name"], entry["dim"]
    if dim is None:
        return "replicated, grad summed over TP" if entry["sequence_parallel"] else "replicated"
    if "word_embeddings" in name or "output_layer" in name:
        return "rows = vocabulary"
    if name.endswith("bias"):
        return "split with its rows"
    return "rows = outputs (column-par.)" if dim == 0 else "columns = inputs (row-par.)"


def table(per_rank: list[list[dict]], tp: int) -> str:
    fmt = lambda s: "[" + ", ".join(map(str, s)) + "]"
    rows = [["parameter", "full", "split", *[f"rank {r}" for r in range(tp)]]]
    for i, entry in enumerate(per_rank[0]):
        rows.append([entry["name"], fmt(full_shape(entry, tp)), how_split(entry),
                     *[fmt(per_rank[r][i]["shape"]) for r in range(tp)]])
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def picture(title: str, shape: list[int], dim: int, tp: int) -> list[str]:
    """A [out, in] weight as a box cut into tp slices: dim 0 cuts rows, dim 1 cuts columns."""
    out, inp = shape
    if dim == 0:
        labels = [f" rank {r}: rows {r * out // tp}-{(r + 1) * out // tp - 1}  [{out // tp}, {inp}] "
                  for r in range(tp)]
        width = max(map(len, labels))
        bar = "+" + "-" * width + "+"
        body = [bar]
        for label in labels:
            body += ["|" + label.ljust(width) + "|", bar]
    else:
        cells = [[f" rank {r}", f" cols {r * inp // tp}-{(r + 1) * inp // tp - 1}", f" [{out}, {inp // tp}]"]
                 for r in range(tp)]
        width = max(len(text) for cell in cells for text in cell) + 1
        bar = "+" + "+".join("-" * width for _ in range(tp)) + "+"
        body = [bar] + ["|" + "|".join(cell[k].ljust(width) for cell in cells) + "|" for k in range(3)] + [bar]
    return [f"{title} [{out}, {inp}]"] + body


def side_by_side(left: list[str], right: list[str], gap: str = "   ") -> str:
    width = max(map(len, left))
    height = max(len(left), len(right))
    left, right = left + [""] * (height - len(left)), right + [""] * (height - len(right))
    return "\n".join((a.ljust(width) + gap + b).rstrip() for a, b in zip(left, right))


def qkv_rows(args) -> str:
    """Which rows of linear_qkv.weight hold which head, and which rank keeps them."""
    d = args.hidden_size // args.num_attention_heads
    per_rank = args.num_attention_heads // args.tp
    lines = ["linear_qkv.weight rows, head by head (q, k, v of a head are adjacent):"]
    for head in range(args.num_attention_heads):
        first = head * 3 * d
        lines.append(f"  rows {first:>3}-{first + 3 * d - 1:<3}  head {head}: q {first}-{first + d - 1},"
                     f" k {first + d}-{first + 2 * d - 1}, v {first + 2 * d}-{first + 3 * d - 1}"
                     f"  -> rank {head // per_rank}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2, help="tensor-model-parallel size (= ranks)")
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--hidden-size", type=int, default=16)
    parser.add_argument("--num-attention-heads", type=int, default=4)
    parser.add_argument("--ffn-hidden-size", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=50)
    parser.add_argument("--make-vocab-size-divisible-by", type=int, default=8)
    parser.add_argument("--seq-length", type=int, default=8)
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    parser.add_argument("--table-only", action="store_true", help="skip the pictures")
    args = parser.parse_args(argv)
    if args.tp < 1 or args.num_attention_heads % args.tp or args.hidden_size % args.num_attention_heads:
        parser.error("need --tp dividing --num-attention-heads, which must divide --hidden-size")

    from minitron.core import parallel_state
    from minitron.launcher import LaunchConfig, RankFailure, run_on_ranks
    from minitron.training.tokenizer import _vocab_size_with_padding

    def rank_main(rank: int) -> list[dict]:
        parallel_state.initialize_model_parallel(args.tp)
        return rank_shapes(args)

    try:
        per_rank = run_on_ranks(rank_main, LaunchConfig(world_size=args.tp, warm=()))
    except RankFailure as failure:
        print(f"{failure}\n{failure.log_tail()}", file=sys.stderr)
        return 1

    vocab = _vocab_size_with_padding(args.vocab_size, args.make_vocab_size_divisible_by, args.tp)
    ffn = args.ffn_hidden_size or 4 * args.hidden_size
    print(f"GPTModel: {args.num_layers} layer(s), hidden {args.hidden_size}, "
          f"{args.num_attention_heads} heads of {args.hidden_size // args.num_attention_heads}, "
          f"ffn {ffn}, vocab {args.vocab_size} padded to {vocab} "
          f"(multiple of {args.make_vocab_size_divisible_by} x tp {args.tp}), tp={args.tp}")
    print()
    print(table(per_rank, args.tp))
    if not args.untie_embeddings_and_output_weights:
        print("(no output_layer.weight: the output layer multiplies by embedding.word_embeddings.weight)")
    if args.table_only:
        return 0
    by_name = {e["name"]: e for e in per_rank[0]}
    draw = lambda title, key: picture(title, full_shape(by_name[key], args.tp), by_name[key]["dim"], args.tp)
    layer = "decoder.layers.0."
    print()
    print("Weights as torch stores them, [out, in]; a column-parallel layer's slice of outputs is")
    print("exactly the slice of inputs the row-parallel layer after it needs:")
    for (t1, k1), (t2, k2) in (
            (("linear_qkv", layer + "self_attention.linear_qkv.weight"),
             ("linear_proj", layer + "self_attention.linear_proj.weight")),
            (("linear_fc1", layer + "mlp.linear_fc1.weight"), ("linear_fc2", layer + "mlp.linear_fc2.weight"))):
        print()
        print(side_by_side(draw(t1, k1), draw(t2, k2)))
    print()
    print(side_by_side(draw("word embedding E (and the tied output layer)",
                            "embedding.word_embeddings.weight"), []))
    print()
    print(qkv_rows(args))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
