"""Benchmark one GPU: minitron's `pretrain` against a plain PyTorch loop of the same GPT.

    python scripts/bench_gpu.py [--iters 10] [--fast] [--json results.json]
    python scripts/bench_gpu.py --cpu-smoke      # no GPU: a tiny model on the CPU, to prove the script runs
    python scripts/bench_gpu.py --fp8 tensorwise # minitron in bf16 against minitron with fp8 GEMMs
    python scripts/bench_gpu.py --show FILE...   # print the figures a --json run recorded

The GPT (defaults: 24 layers, hidden 2048, 16 heads, sequence 2048, the GPT-2 vocabulary of 50257
padded to 50304, micro-batch 4, global batch 32, i.e. 8 micro-batches per iteration, bf16) is
trained three ways, each in a fresh process so that no side inherits another's memory or
compiled kernels:

* minitron: `python -m minitron pretrain --world 1 --backend nccl --bf16 ... --mock-data`; its
  per-iteration times come from its own `--log-jsonl` records;
* the plain loop of scripts/plain_gpt.py (embedding, pre-LayerNorm blocks with one fused QKV projection
  and torch's scaled_dot_product_attention, a GeLU MLP of 4h, the tied output layer, cross
  entropy, fused AdamW, bf16 autocast over fp32 parameters), eager;
* the same loop under torch.compile.

Each side's figure is the median over iterations 4..N: the first three pay for allocator
growth, cuDNN/cuBLAS autotuning and compilation. TFLOP/s/GPU is Megatron's model FLOP count
(minitron/training/theoretical_flops.py), made once from minitron's own parser, so all three
sides divide the same number; MFU divides that by the device's dense bf16 peak from the same
module's table.

--fast adds FAST_PATH_FLAGS to minitron's command line: its opt-in fusions (minitron/core/fusions/,
compiled by torch.compile; the activation's flag that does not fit the model is ignored, as in Megatron).

--fp8 RECIPE measures what fp8 buys instead: minitron twice, in bf16 and with FP8_FLAGS plus
``--fp8-recipe RECIPE`` (on an fp8-capable GPU, the GEMMs of minitron/core/fp8/linear.py go to
torch._scaled_mm), and no plain loop; the ratio is fp8's tokens/s over bf16's. The FLOP count and
so the MFU are bf16's model FLOPs for both, as Megatron counts an fp8 run.

Without a GPU the script says so and exits 2; --cpu-smoke then runs all three sides on the CPU
at a tiny size (gloo, fp32; torch.compile with its "eager" backend, which captures the graph but
generates no code: inductor's C++ build would take longer than the whole smoke run). Its
figures prove only that every part runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # run from a checkout without installing it (the GPU machine)
# and its report module beside it, also when this file is loaded by path (a test) rather than
# run as a script, which alone puts the script's folder on the path
sys.path.insert(0, str(ROOT / "scripts"))

from bench_gpu_report import FIRST_TIMED, MODEL_FIELDS, fp8_table, goals, report, show  # noqa: E402 (beside this file)

# minitron's opt-in fast-path flags, added by --fast (see the docstring).
FAST_PATH_FLAGS: list[str] = ["--bias-gelu-fusion", "--bias-swiglu-fusion", "--bias-dropout-fusion",
                              "--cross-entropy-loss-fusion"]
# --fp8: Transformer Engine's usual training format (e4m3 forward, e5m2 gradients); the recipe is the flag's.
FP8_FLAGS: list[str] = ["--fp8-format", "hybrid"]
SMOKE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64, micro_batch_size=2,
             global_batch_size=4, vocab_size=255, iters=4)


class Parser(argparse.ArgumentParser):
    def error(self, message):   # one line, not argparse's usage block
        print(f"bench_gpu: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def options(argv=None) -> argparse.Namespace:
    p = Parser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--num-layers", type=int, default=24)
    p.add_argument("--hidden-size", type=int, default=2048)
    p.add_argument("--num-attention-heads", type=int, default=16)
    p.add_argument("--seq-length", type=int, default=2048)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--global-batch-size", type=int, default=32)
    p.add_argument("--vocab-size", type=int, default=50257)
    p.add_argument("--iters", type=int, default=10, help=f"iterations per side (at least {FIRST_TIMED})")
    p.add_argument("--fast", action="store_true", help="add minitron's fast-path flags (FAST_PATH_FLAGS)")
    p.add_argument("--fp8", choices=["tensorwise", "delayed", "mxfp8", "blockwise"], metavar="RECIPE",
                   help="minitron in bf16 against minitron with fp8 GEMMs of this recipe (no plain loop)")
    p.add_argument("--cpu-smoke", action="store_true", help="a tiny model on the CPU: proves the script runs")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument("--show", type=Path, nargs="+", metavar="FILE",
                   help="print the figures recorded by earlier --json runs (docs/gpu-runs/), run nothing")
    p.add_argument("--plain-child", help=argparse.SUPPRESS)   # the plain loops' own process
    if "--cpu-smoke" in (sys.argv[1:] if argv is None else argv):
        p.set_defaults(**SMOKE)   # the tiny size, unless a flag says otherwise
    o = p.parse_args(argv)
    if o.iters < FIRST_TIMED:
        p.error(f"--iters {o.iters}: iterations 1-{FIRST_TIMED - 1} warm up; give at least {FIRST_TIMED}")
    if o.global_batch_size % o.micro_batch_size:
        p.error(f"--global-batch-size {o.global_batch_size} is no multiple of --micro-batch-size "
                f"{o.micro_batch_size}: one GPU runs whole micro-batches")
    o.device = "cpu" if o.cpu_smoke else "cuda"
    return o


def megatron_flags(o) -> list[str]:
    """The model and batch, as Megatron's flags: minitron's command line and the FLOP count's."""
    return ["--num-layers", str(o.num_layers), "--hidden-size", str(o.hidden_size),
            "--num-attention-heads", str(o.num_attention_heads), "--seq-length", str(o.seq_length),
            "--max-position-embeddings", str(o.seq_length), "--micro-batch-size", str(o.micro_batch_size),
            "--global-batch-size", str(o.global_batch_size), "--train-iters", str(o.iters),
            "--lr", "1e-4", "--min-lr", "1e-5", "--lr-decay-style", "cosine", "--mock-data",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", str(o.vocab_size),
            "--hidden-dropout", "0", "--attention-dropout", "0", *([] if o.cpu_smoke else ["--bf16"])]


def model_size(o) -> tuple[float, int]:
    """(Megatron's FLOPs per iteration, the padded vocabulary), from minitron's parser and
    validation, as a rank of a one-GPU world would see them. The count is made here, in no
    rank, so the backend is gloo's stand-in: it does not enter the count."""
    from minitron.training.arguments import GPT_ARGS_DEFAULTS, megatron_parser, validate_args
    from minitron.training.theoretical_flops import num_floating_point_operations
    from minitron.training.tokenizer import build_tokenizer

    args = megatron_parser().parse_args(megatron_flags(o) + ["--distributed-backend", "gloo"])
    args.world_size, args.rank, args.local_rank = 1, 0, 0
    args = validate_args(args, GPT_ARGS_DEFAULTS)
    build_tokenizer(args)   # sets padded_vocab_size
    return num_floating_point_operations(args, o.global_batch_size), args.padded_vocab_size


# -- the plain loop ------------------------------------------------------------------------------
def plain_side(o, vocab: int, compiled: bool) -> dict:
    """The plain loop's times per iteration (seconds) and peak memory, in this process."""
    import torch

    torch.manual_seed(0)
    cuda = o.device == "cuda"
    from plain_gpt import PlainGPT   # scripts/plain_gpt.py, beside this script (torch: lazy)

    model = PlainGPT(vocab, o.hidden_size, o.num_layers, o.num_attention_heads, o.seq_length).to(o.device)
    step_model = torch.compile(model, backend="inductor" if cuda else "eager") if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=cuda)
    microbatches = o.global_batch_size // o.micro_batch_size
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(o.iters):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for _ in range(microbatches):
            # Token ids of the real vocabulary; the padded rows are never a label, as in minitron.
            tokens = torch.randint(0, o.vocab_size, (o.micro_batch_size, o.seq_length + 1), device=o.device)
            with autocast:
                loss = step_model(tokens[:, :-1], tokens[:, 1:]) / microbatches
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if cuda:
            torch.cuda.synchronize()   # the GPU's work, not only its launch
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    del model, step_model, opt
    if cuda:
        torch.cuda.empty_cache()
    return {"times": times, "peak_gib": peak}


def plain_child(o) -> None:
    """Both plain sides in this (child) process, one JSON line on stdout."""
    import torch
    vocab = int(o.plain_child)
    device = torch.cuda.get_device_name() if o.device == "cuda" else "CPU"
    eager = plain_side(o, vocab, compiled=False)
    print(json.dumps({"device": device, "eager": eager, "compiled": plain_side(o, vocab, compiled=True)}))


# -- running the sides ---------------------------------------------------------------------------
def run_child(cmd: list[str], what: str, o) -> str:
    # The smoke's model is tiny: more than one thread per process only spins on a shared machine.
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if o.cpu_smoke else None
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if done.returncode:
        sys.exit(f"bench_gpu: {what} failed (exit code {done.returncode}):\n"
                 f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def minitron_side(o, extra: list[str] = ()) -> dict:
    """minitron's times per iteration from its --log-jsonl, and its peak memory from the
    memory line its rank log carries on a GPU (None on the CPU, where there is none)."""
    with tempfile.TemporaryDirectory() as tmp:
        jsonl, logs = Path(tmp, "iterations.jsonl"), Path(tmp, "logs")
        cmd = [sys.executable, "-m", "minitron", "pretrain", "--world", "1",
               "--backend", "gloo" if o.cpu_smoke else "nccl", "--log-dir", str(logs), *megatron_flags(o),
               "--log-interval", "1", "--log-jsonl", str(jsonl), "--log-throughput",
               *(FAST_PATH_FLAGS if o.fast else []), *extra]
        run_child(cmd, "minitron pretrain", o)
        records = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
        peaks = re.findall(r"max allocated: ([0-9.]+)", "".join(p.read_text() for p in logs.glob("rank*.log")))
    return {"times": [r["elapsed_ms"] / 1000.0 for r in records],
            "peak_gib": max(float(mb) for mb in peaks) / 1024.0 if peaks else None}


def figures(side: dict, o, flops: float, peak_tflops: float | None) -> dict:
    seconds = statistics.median(side["times"][FIRST_TIMED - 1:])
    tflops = flops / seconds / 1e12
    return {"ms_per_iteration": seconds * 1000.0, "tokens_per_s": o.global_batch_size * o.seq_length / seconds,
            "tflops_per_gpu": tflops, "mfu": tflops / peak_tflops if peak_tflops else None,
            "peak_memory_gib": side["peak_gib"]}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    o = options(argv)
    if o.show:
        return show(o.show)
    if o.plain_child:
        plain_child(o)
        return 0
    if not o.cpu_smoke:
        import torch
        if not torch.cuda.is_available():
            print("bench_gpu: no CUDA GPU here; run it on a machine with one, or add --cpu-smoke to check "
                  "the script on the CPU", file=sys.stderr)
            return 2
    from minitron.training.theoretical_flops import peak_tflops_of

    flops, vocab = model_size(o)
    if o.fp8:
        return fp8_main(o, flops, vocab)
    plain = json.loads(run_child([sys.executable, __file__, *argv, "--plain-child", str(vocab)],
                                 "the plain loop", o).strip().splitlines()[-1])
    sides = {"minitron": minitron_side(o), "plain eager": plain["eager"], "plain compiled": plain["compiled"]}
    peak = None if o.cpu_smoke else peak_tflops_of(plain["device"])
    results = {name: figures(side, o, flops, peak) for name, side in sides.items()}
    tokens = {name: r["tokens_per_s"] for name, r in results.items()}
    ratios = {"minitron/eager": tokens["minitron"] / tokens["plain eager"],
              "minitron/compiled": tokens["minitron"] / tokens["plain compiled"]}
    report(o, plain["device"], vocab, flops, peak, results, ratios)
    if o.json:
        fast_flags = FAST_PATH_FLAGS if o.fast else []   # the flags this run added
        import torch
        model = {**{k: getattr(o, k) for k in MODEL_FIELDS}, "padded_vocab": vocab}
        o.json.write_text(json.dumps({"recorded": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                                      "model": model, "device": plain["device"], "fast": o.fast,
                                      "fast_flags": fast_flags,
                                      "flops_per_iteration": flops, "peak_tflops": peak, "results": results,
                                      "ratios": ratios, "goals": goals(o, plain["device"], results, ratios)},
                                     indent=2) + "\n")
    return 0


def fp8_main(o, flops: float, vocab: int) -> int:
    """--fp8: the same model in bf16 and in fp8, both minitron's; the device named by torch here."""
    import torch

    from minitron.training.theoretical_flops import peak_tflops_of
    device = torch.cuda.get_device_name() if o.device == "cuda" else "CPU"
    fp8_flags = [*FP8_FLAGS, "--fp8-recipe", o.fp8]
    sides = {"minitron": minitron_side(o), f"minitron fp8 {o.fp8}": minitron_side(o, fp8_flags)}
    peak = None if o.cpu_smoke else peak_tflops_of(device)
    results = {name: figures(side, o, flops, peak) for name, side in sides.items()}
    bf16, fp8 = (r["tokens_per_s"] for r in results.values())
    ratios = {"fp8/bf16": fp8 / bf16}
    print(f"GPT: {o.num_layers} layers, hidden {o.hidden_size}, sequence {o.seq_length}, vocabulary {o.vocab_size} "
          f"padded to {vocab}, batch {o.micro_batch_size} x {o.global_batch_size // o.micro_batch_size}, "
          f"one {device}; fp8 side: {' '.join(fp8_flags)}")
    fp8_table(o, flops, results, ratios)
    if o.json:
        model = {**{k: getattr(o, k) for k in MODEL_FIELDS}, "padded_vocab": vocab}
        o.json.write_text(json.dumps({"recorded": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                                      "model": model, "device": device, "fp8_flags": fp8_flags,
                                      "flops_per_iteration": flops, "peak_tflops": peak, "results": results,
                                      "ratios": ratios}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
