"""What scripts/bench_gpu.py prints and keeps: the tables of a run, the goal beside them, and
--show, which prints a recorded run's file (docs/gpu-runs/) as the run printed it.

Measuring is bench_gpu.py's; this half only formats, so that a page can show a GPU run's figures
on a machine without a GPU, from the file the run wrote.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# The goal stated beside the figures: on one H100, at the default (1.3B) size.
GOAL = {"device": "h100", "minitron_over_eager": 1.0, "mfu": 0.45}
FIRST_TIMED = 4   # iterations before this one warm up


def goals(o, device: str, results: dict, ratios: dict) -> str:
    default_size = [o.num_layers, o.hidden_size, o.seq_length] == [24, 2048, 2048]
    if o.cpu_smoke:
        return "goals not checked: no GPU"
    if GOAL["device"] not in device.lower() or not default_size:
        return f"goals not checked: they are stated for one H100 at the default (1.3B) size, not {device}"
    mfu = results["minitron"]["mfu"] or 0.0
    met = ratios["minitron/eager"] >= GOAL["minitron_over_eager"] and mfu >= GOAL["mfu"]
    return f"goals {'met' if met else 'NOT met'}: minitron/eager {ratios['minitron/eager']:.2f}x, MFU {mfu:.1%}"


def report(o, device: str, vocab: int, flops: float, peak: float | None, results: dict, ratios: dict) -> None:
    def number(value, spec):
        return "n/a" if value is None else format(value, spec)

    print(f"GPT: {o.num_layers} layers, hidden {o.hidden_size}, {o.num_attention_heads} heads, sequence "
          f"{o.seq_length}, vocabulary {o.vocab_size} padded to {vocab}, micro-batch {o.micro_batch_size}, "
          f"global batch {o.global_batch_size}, {'fp32' if o.cpu_smoke else 'bf16'}, one {device}")
    print(f"Megatron's FLOP count: {flops:.3e} per iteration; peak {number(peak, 'g')} TFLOP/s "
          f"(dense bf16, minitron/training/theoretical_flops.py){'; --fast' if o.fast else ''}")
    table(o, device, results, ratios)


def table(o, device: str, results: dict, ratios: dict) -> None:
    """The figures, 75 columns wide: the part of a run's report a page shows."""
    def number(value, spec):
        return "n/a" if value is None else format(value, spec)

    print(f"median of iterations {FIRST_TIMED}-{o.iters}:")
    print(f"{'side':<18} {'ms/iteration':>12} {'tokens/s':>12} {'TFLOP/s/GPU':>12} {'MFU':>7} {'peak GiB':>9}")
    for name, r in results.items():
        print(f"{name:<18} {r['ms_per_iteration']:>12.1f} {r['tokens_per_s']:>12.1f} "
              f"{r['tflops_per_gpu']:>12.4g} {number(r['mfu'], '.1%'):>7} {number(r['peak_memory_gib'], '.2f'):>9}")
    for name, value in ratios.items():
        print(f"ratio {name}: {value:.3f}x (tokens/s)")
    print(f"goal: minitron/eager >= {GOAL['minitron_over_eager']:.1f}x and MFU >= {GOAL['mfu']:.0%} on one H100 "
          f"(1.3B config)")
    print(goals(o, device, results, ratios))


MODEL_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
                "global_batch_size", "vocab_size", "iters", "fast")


def show(paths: list[Path]) -> int:
    """Print what --json runs recorded, as the run printed it, each under where it ran: the
    figures a page quotes come from a file a real run wrote, not from prose."""
    for path in paths:
        try:
            rec = json.loads(path.read_text())
            o = argparse.Namespace(cpu_smoke=False, **{k: rec["model"][k] for k in MODEL_FIELDS})
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"bench_gpu: {path} is not a file that --json wrote ({err}); give one from docs/gpu-runs/",
                  file=sys.stderr)
            return 2
        fp8 = rec.get("fp8_flags")
        print(f"{path.name}: {'--fp8: ' + ' '.join(fp8) if fp8 else '--fast' if o.fast else 'default path'}, "
              f"{rec['device']}")
        print(f"  recorded {rec['recorded']}")
        print(f"  torch {rec['torch']}")
        print(f"  GPT {o.num_layers} layers, hidden {o.hidden_size}, sequence {o.seq_length}, "
              f"batch {o.micro_batch_size} x {o.global_batch_size // o.micro_batch_size}, bf16")
        if fp8:
            fp8_table(o, rec["flops_per_iteration"], rec["results"], rec["ratios"])
        else:
            table(o, rec["device"], rec["results"], rec["ratios"])
        print()
    return 0


def fp8_table(o, flops: float, results: dict, ratios: dict) -> None:
    print(f"median of iterations {FIRST_TIMED}-{o.iters} (MFU: bf16 model FLOPs {flops:.3e} over the dense bf16 peak):")
    print(f"{'side':<26} {'ms/iteration':>12} {'tokens/s':>12} {'MFU':>7} {'peak GiB':>9}")
    for name, r in results.items():
        mfu = "n/a" if r["mfu"] is None else format(r["mfu"], ".1%")
        mem = "n/a" if r["peak_memory_gib"] is None else format(r["peak_memory_gib"], ".2f")
        print(f"{name:<26} {r['ms_per_iteration']:>12.1f} {r['tokens_per_s']:>12.1f} {mfu:>7} {mem:>9}")
    print(f"ratio fp8/bf16: {ratios['fp8/bf16']:.3f}x (tokens/s)")
