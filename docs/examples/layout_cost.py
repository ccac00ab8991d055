"""A GPT-3-sized model (175B) at the layouts of the Megatron papers: chapter 17 runs this.

    python docs/examples/layout_cost.py table        # estimate vs Megatron's formulas, stage 0
    python docs/examples/layout_cost.py share        # 12·L·h² as a share of the parameters
    python docs/examples/layout_cost.py svg [PATH]   # memory per rank against tp and pp

Every figure comes from minitron's estimator (training/theoretical_memory_usage.py) on the
validated flags, the same path `minitron estimate` takes; Megatron's figures are its
theoretical_memory_usage formulas, written out in tests/test_estimate.py and here.
"""

from __future__ import annotations

import sys

from minitron.cli.common import validate_pretrain
from minitron.cli.views.words import human
from minitron.training import theoretical_memory_usage as tmu
from minitron.training.tokenizer import build_tokenizer

WORLD = 1024
GPT3 = ["--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96", "--seq-length", "2048",
        "--micro-batch-size", "1", "--vocab-size", "50256", "--bf16", "--accumulate-allreduce-grads-in-fp32",
        "--attention-dropout", "0"]
LAYOUTS = [(8, 8, 1536, False), (8, 16, 1536, False), (8, 16, 1536, True)]


def costs(tp: int, pp: int, batch: int, dist_opt: bool, world: int = WORLD):
    argv = GPT3 + ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
                   "--global-batch-size", str(batch)] + (["--use-distributed-optimizer"] if dist_opt else [])
    args = validate_pretrain(argv, world)
    build_tokenizer(args)
    return args, tmu.report_theoretical_memory(args)


def megatron(args) -> tuple[float, float]:
    """Megatron's weight-and-optimizer bytes and activation bytes (without sequence
    parallelism) for its most loaded rank, stage 0."""
    L, h, s, V = args.num_layers, args.hidden_size, args.seq_length, args.padded_vocab_size
    tp, pp, dp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.data_parallel_size
    params = (12 * h * h * L / pp + V * h) / tp + (4 * h * L + 2 * h) / pp
    weights = params * (6 + 12 / dp if args.use_distributed_optimizer else 18)
    m = args.global_batch_size // dp
    act = (s * h * (10 + 24 / tp) * L + 8 * s * pp + s * h * pp) * min(1, m / pp) * 1.05
    return weights, act


def table() -> None:
    print(f"GPT-3 175B ({tmu.total_params(costs(8, 8, 1536, False)[0]):,} parameters here), {WORLD} ranks, bf16,"
          " micro-batch 1, global batch 1536")
    print(f"{'layout':<27} {'':>9} {'weights+grads+optimizer':>24} {'activations':>12} {'total':>10}")
    for tp, pp, batch, dist_opt in LAYOUTS:
        args, out = costs(tp, pp, batch, dist_opt)
        first = out[0].memory
        ours_w = first["params"] + first["grads"] + first["optimizer"]
        theirs_w, theirs_a = megatron(args)
        name = f"tp {tp} x pp {pp} x dp {args.data_parallel_size}" + (" ZeRO-1" if dist_opt else "")
        print(f"{name:<27} {'minitron':>9} {human(ours_w):>24} {human(first['activations']):>12} "
              f"{human(ours_w + first['activations']):>10}")
        print(f"{'':<27} {'Megatron':>9} {human(theirs_w):>24} {human(theirs_a):>12} {human(theirs_w + theirs_a):>10}")


def share_lines(args) -> list[str]:
    """How much of the model the 12·L·h² term is: the count the chapter's prose leans on, from
    the same total the estimator prints (V padded for tp 8, as the 1024-rank run pads it)."""
    L, h, V = args.num_layers, args.hidden_size, args.padded_vocab_size
    total, layers = tmu.total_params(args), 12 * L * h * h
    return [f"P = {total:,} parameters (L = {L}, h = {h}, V = {V:,} padded, s = {args.seq_length})",
            f"12·L·h² = {layers:,} = {100 * layers / total:.2f} % of P"]


TPS, PPS = (1, 2, 4, 8), (1, 2, 4, 8, 16, 32)
COLOURS = {1: "#9e9e9e", 2: "#42a5f5", 4: "#ab47bc", 8: "#ef6c00"}


def memory_svg() -> str:
    """The largest rank's memory (GiB, log scale) against pp, one line per tp, GPT-3 175B on
    1024 ranks with the distributed optimizer; the dashed line is an 80 GiB GPU. Drawn on the
    column's width in the pictures' text sizes (minitron/cli/views/svg.py)."""
    import math

    from minitron.cli.views import svg

    width, height, left, right, top, bottom = svg.COLUMN, 420, 64, 110, 36, 52
    lo, hi = 4, 4096   # GiB on the axis
    points = {}
    for tp in TPS:
        for pp in PPS:
            _, out = costs(tp, pp, 3072, True)
            points[(tp, pp)] = max(sum(c.memory.values()) for c in out) / 2**30

    def x(pp):
        return left + PPS.index(pp) * (width - left - right) / (len(PPS) - 1)

    def y(gib):
        return top + (math.log2(hi) - math.log2(min(max(gib, lo), hi))) * (height - top - bottom) / math.log2(hi / lo)

    size = svg.TEXT
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" font-family="sans-serif" font-size="{size}" role="img" style="width:100%;height:auto" '
           'aria-label="memory of the largest rank against pipeline and tensor parallel size">']
    for gib in (4, 16, 64, 256, 1024, 4096):
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(gib):.1f}" y2="{y(gib):.1f}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{left - 8}" y="{y(gib) + 5:.1f}" text-anchor="end" fill="#616161">{gib}</text>')
    out.append(f'<text x="0" y="{top - 14}" fill="#616161">GiB per rank (largest)</text>')
    for pp in PPS:
        out.append(f'<text x="{x(pp):.1f}" y="{height - bottom + 20}" text-anchor="middle" fill="#616161">{pp}</text>')
    out.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 8}" text-anchor="middle" '
               'fill="#616161">pipeline-parallel size (pp)</text>')
    out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(80):.1f}" y2="{y(80):.1f}" stroke="#d32f2f" '
               'stroke-dasharray="4 3"/>')
    # Labels at the right edge, one for each curve's end and one for the GPU line. Ends closer
    # than a line of text would print on top of each other (tp 4 and tp 8 end 40 px apart at
    # 11 px type, the GPU line between them), so each label goes where its line ends, pushed
    # down below the one above, then the stack is lifted as a whole if it runs off the bottom;
    # a leader line joins a pushed label to its line's end.
    labels = {f"tp {tp}": (y(points[(tp, PPS[-1])]), COLOURS[tp]) for tp in TPS}
    labels["80 GiB GPU"] = (y(80), "#d32f2f")
    ends = sorted(labels.items(), key=lambda item: item[1][0])
    pitch, placed = size * 1.5, []
    for _, (at, _) in ends:
        placed.append(max(at, placed[-1] + pitch) if placed else at)
    lift = max(0.0, placed[-1] - (height - bottom))
    placed = [p - lift for p in placed]
    edge = width - right
    for (name, (at, colour)), shown in zip(ends, placed):
        if abs(shown - at) > 1:
            out.append(f'<polyline points="{edge:.1f},{at:.1f} {edge + 10:.1f},{at:.1f} {edge + 22:.1f},{shown:.1f}" '
                       f'fill="none" stroke="{colour}" stroke-width="1"/>')
        out.append(f'<text x="{edge + 26}" y="{shown + size * 0.35:.1f}" fill="{colour}" data-end="{at:.1f}">'
                   f'{name}</text>')
    for tp in TPS:
        line = " ".join(f"{x(pp):.1f},{y(points[(tp, pp)]):.1f}" for pp in PPS)
        out.append(f'<polyline points="{line}" fill="none" stroke="{COLOURS[tp]}" stroke-width="2.5"/>')
        for pp in PPS:
            gib = points[(tp, pp)]
            out.append(f'<circle cx="{x(pp):.1f}" cy="{y(gib):.1f}" r="4" fill="{COLOURS[tp]}">'
                       f'<title>tp {tp} x pp {pp}: {gib:.1f} GiB</title></circle>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["table"]:
        table()
    elif sys.argv[1:2] == ["share"]:
        print("\n".join(share_lines(costs(8, 16, 1536, True)[0])))
    elif sys.argv[1:2] == ["svg"]:
        svg = memory_svg()
        if len(sys.argv) > 2:
            open(sys.argv[2], "w").write(svg)
        else:
            print(svg, end="")
    else:
        sys.exit(__doc__)
