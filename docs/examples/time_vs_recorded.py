"""The time model on one H100, compute only, beside minitron's recorded run of the same model
(docs/gpu-runs/2026-11-27-h100.json): chapter 17 runs this.

    python docs/examples/time_vs_recorded.py

The MFU the model uses is the run's own, so the times agree by construction; what is checked
is that the estimate counts the same FLOPs the bench divided by, so its MFU means the same.
"""

from __future__ import annotations

import json

from minitron.cli.common import validate_pretrain
from minitron.training.clusters import BUILT_IN
from minitron.training.theoretical_memory_usage import report_theoretical_memory
from minitron.training.theoretical_time import RECORDED_RUN, iteration_time, recorded_mfu
from minitron.training.tokenizer import build_tokenizer


def main() -> None:
    run = json.loads(RECORDED_RUN.read_text())
    m = run["model"]
    argv = ["--num-layers", m["num_layers"], "--hidden-size", m["hidden_size"], "--num-attention-heads",
            m["num_attention_heads"], "--seq-length", m["seq_length"], "--micro-batch-size", m["micro_batch_size"],
            "--global-batch-size", m["global_batch_size"], "--vocab-size", m["vocab_size"], "--bf16"]
    args = validate_pretrain([str(a) for a in argv], 1)
    build_tokenizer(args)
    mfu, source = recorded_mfu()
    t = iteration_time(args, report_theoretical_memory(args), BUILT_IN["h100"], mfu)
    recorded = run["results"]["minitron"]["ms_per_iteration"]
    print(f"model: {m['num_layers']} layers, hidden {m['hidden_size']}, seq {m['seq_length']}, "
          f"micro-batch {m['micro_batch_size']}, global batch {m['global_batch_size']}, one GPU")
    print(f"FLOPs per iteration: estimate {t['flops_per_iteration']:.6g}, recorded {run['flops_per_iteration']:.6g}"
          f" ({'the same count' if t['flops_per_iteration'] == run['flops_per_iteration'] else 'DIFFERENT'})")
    print(f"at MFU {mfu:.2%} ({source}):")
    print(f"  estimate {t['iteration_s'] * 1e3:,.0f} ms per iteration, recorded {recorded:,.0f} ms "
          f"({t['iteration_s'] * 1e3 / recorded - 1:+.2%})")


if __name__ == "__main__":
    main()
