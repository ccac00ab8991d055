"""Mamba-2 layers beside attention: chapter 22 runs this.

    python docs/examples/hybrid_models.py scan    # the chunked scan against the step-by-step one
    python docs/examples/hybrid_models.py split   # what tensor parallelism cuts in a Mamba layer
    python docs/examples/hybrid_models.py cost    # Nemotron-H 8B against an all-attention model
    python docs/examples/hybrid_models.py layouts # serial, tp 2, and two uneven pipeline stages train alike
    python docs/examples/hybrid_models.py check   # estimate --check against a traced tp 2 x pp 2 run

``scan`` runs core/ssm/ssd.py's two forms on the same random inputs; ``split`` and ``cost`` ask
the accountant (training/theoretical_mamba.py and the estimate around it) on validated flags,
the path `minitron estimate` takes, which tests/test_hybrid_estimate.py holds to real runs.
``layouts`` and ``check`` run `minitron` itself and print each command line before its output
(a pattern's '|' would read as a pipe in a page's run line, so the commands live here).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

# Nemotron-H 8B as Megatron's examples configure it (modelopt's Nemotron-H-8B-Base-8K.sh):
# 52 layers, 24 Mamba, 4 attention, 24 MLP; rope on half of each head's channels.
NEMOTRON_H_8B = ["--hybrid-layer-pattern", "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
                 "--hidden-size", "4096", "--ffn-hidden-size", "21504", "--num-attention-heads", "32",
                 "--group-query-attention", "--num-query-groups", "8", "--mamba-head-dim", "64",
                 "--mamba-num-heads", "128", "--mamba-num-groups", "8", "--mamba-state-dim", "128",
                 "--position-embedding-type", "rope", "--rotary-percent", "0.5", "--normalization", "RMSNorm",
                 "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--vocab-size", "131072",
                 "--make-vocab-size-divisible-by", "1", "--bf16", "--attention-dropout", "0", "--hidden-dropout", "0",
                 "--micro-batch-size", "1", "--use-distributed-optimizer"]


def scan() -> None:
    import torch
    import torch.nn.functional as F

    from minitron.core.ssm.ssd import ssd_chunked, ssd_recurrence
    torch.manual_seed(0)
    torch.set_num_threads(1)
    heads, headdim, groups, state = 8, 16, 2, 16
    print(f"one sequence, {heads} heads of {headdim} channels, {groups} groups, state {state}, fp64")
    print(f"{'tokens':>7} {'chunk':>6} {'sequential steps':>17} {'max |difference|':>17} "
          f"{'step by step':>13} {'chunked':>9}")
    for length, chunk in ((64, 16), (256, 64), (1024, 128), (1024, 256)):
        x = torch.randn(1, length, heads, headdim, dtype=torch.float64)
        dt = F.softplus(torch.randn(1, length, heads, dtype=torch.float64))
        A = -torch.rand(heads, dtype=torch.float64) * 4
        B, C = (torch.randn(1, length, groups, state, dtype=torch.float64) for _ in range(2))
        started = time.perf_counter()
        slow = ssd_recurrence(x, dt, A, B, C)
        middle = time.perf_counter()
        fast = ssd_chunked(x, dt, A, B, C, chunk)
        done = time.perf_counter()
        print(f"{length:>7} {chunk:>6} {length:>8} -> {-(-length // chunk):<6} {(slow - fast).abs().max().item():>17.1e} "
              f"{(middle - started) * 1e3:>10.1f} ms {(done - middle) * 1e3:>6.1f} ms")


def _args(extra: list[str], world: int = 1):
    from minitron.cli.common import validate_pretrain
    from minitron.training.tokenizer import build_tokenizer
    args = validate_pretrain(NEMOTRON_H_8B + extra, world)
    build_tokenizer(args)
    return args


def split() -> None:
    from minitron.training.theoretical_mamba import mamba_dims, mamba_layer_params
    print("one Mamba layer of Nemotron-H 8B, each parameter's elements on one rank")
    rows = {}
    for tp in (1, 2, 4, 8):
        args = _args(["--tensor-model-parallel-size", str(tp), "--global-batch-size", "8", "--seq-length", "4096"], tp)
        for p in mamba_layer_params(args, ""):
            rows.setdefault(p.name, []).append(p.numel)
    print(f"{'parameter':<22}" + "".join(f"{'tp ' + str(t):>12}" for t in (1, 2, 4, 8)))
    for name, counts in rows.items():
        print(f"{name:<22}" + "".join(f"{c:>12,}" for c in counts))
    m = mamba_dims(args)
    print(f"in_proj's rows: z {m.inner}, x {m.inner}, B {m.gn}, C {m.gn}, dt {m.heads}; "
          f"at tp 8 each rank keeps {m.inner // 8}, {m.inner // 8}, {m.gn // 8}, {m.gn // 8}, {m.heads // 8}")


def cost() -> None:
    from minitron.cli.views.words import human
    from minitron.training import theoretical_memory_usage as tmu
    from minitron.training.theoretical_flops import num_floating_point_operations

    from minitron.training.theoretical_mamba import D_CONV, mamba_dims

    def row(name, extra, seq):
        args = _args(extra + ["--seq-length", str(seq), "--max-position-embeddings", str(seq),
                              "--tensor-model-parallel-size", "4", "--sequence-parallel",
                              "--global-batch-size", "4"], 4)
        rank = tmu.report_theoretical_memory(args)[0]
        flops = num_floating_point_operations(args, 1) / 1e12
        # What generating after `seq` tokens keeps per sequence (bf16): keys and values of every
        # token for each attention layer; a fixed state per Mamba layer (the scan's heads x
        # head_dim x state, the conv's last d_conv - 1 inputs), however long the sequence.
        pattern, m = args.hybrid_layer_pattern, mamba_dims(args)
        kv = pattern.count("*") * 2 * seq * args.num_query_groups * args.kv_channels * 2
        ssm = pattern.count("M") * (m.heads * args.mamba_head_dim * args.mamba_state_dim + m.conv * (D_CONV - 1)) * 2
        print(f"{name:<27} {seq:>7,} {tmu.total_params(args) / 1e9:>6.2f} B {flops / seq * 1e3:>12.1f} "
              f"{human(rank.memory['activations']):>12} {human(kv + ssm):>15}")
    # An all-attention model of the same size: transformer layers ('*' then '-') of the same
    # widths, as many as make about as many parameters (32: 8.05 B against 8.10 B).
    gpt = ["--hybrid-layer-pattern", "*-" * 32]
    print("tp 4 with sequence parallelism, bf16; activations: rank 0, one sequence per micro-batch")
    print(f"{'model':<27} {'tokens':>7} {'params':>8} {'GFLOP/token':>12} {'activations':>12} "
          f"{'inference state':>15}")
    for seq in (4096, 16384, 65536):
        row("Nemotron-H 8B (24 M, 4 *)", [], seq)
        row("attention only (32 *)", gpt, seq)


TOY = ["--hidden-size", "32", "--num-attention-heads", "4", "--mamba-head-dim", "8", "--mamba-num-groups", "2",
       "--mamba-state-dim", "8", "--normalization", "RMSNorm", "--disable-bias-linear", "--mock-data", "--lr", "1e-3"]


def _minitron(*argv: str, keep=lambda line: True) -> None:
    print("$ minitron " + shlex.join(argv))
    done = subprocess.run(["minitron", *argv], capture_output=True, text=True)
    for line in (done.stdout + done.stderr).splitlines():
        if keep(line):
            print(line)
    if done.returncode:
        raise SystemExit(f"minitron exited with {done.returncode}")


def layouts() -> None:
    same = TOY + ["--position-embedding-type", "none", "--vocab-size", "255", "--hidden-dropout", "0",
                  "--attention-dropout", "0", "--seq-length", "16", "--micro-batch-size", "2",
                  "--global-batch-size", "4", "--train-iters", "3"]
    for name, argv in (("serial", ["--world", "1", "--hybrid-layer-pattern", "M*-M"]),
                       ("tp2", ["--world", "2", "--tp", "2", "--sequence-parallel", "--hybrid-layer-pattern", "M*-M"]),
                       ("pp2", ["--world", "2", "--pp", "2", "--hybrid-layer-pattern", "M*-|M"])):
        _minitron("pretrain", *argv, *same, "--log-dir", f"docs-out/hybrid/{name}",
                  keep=lambda line: line.startswith("lm loss"))


def check() -> None:
    trace = "docs-out/hybrid/cost"
    _minitron("pretrain", "--world", "4", "--tp", "2", "--pp", "2", "--sequence-parallel", "--hybrid-layer-pattern",
              "M*-M|M-", *TOY, "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "2",
              "--train-iters", "1", "--vocab-size", "1023", "--log-dir", trace + "-logs", "--trace", trace,
              keep=lambda line: False)
    _minitron("estimate", "--check", trace)


if __name__ == "__main__":
    {"scan": scan, "split": split, "cost": cost, "layouts": layouts, "check": check}[sys.argv[1]]()
