"""The estimate on one H100 beside minitron's recorded run of the same model
(docs/gpu-runs/2026-11-27-h100.json): chapter 17b runs this.

    python docs/examples/time_vs_recorded.py

Time: compute only (one GPU has no communication and no bubble). The MFU the model uses is the
run's own, so the times agree by construction; what is checked is that the estimate counts the
same FLOPs the bench divided by, so its MFU means the same.

Memory: the one figure where estimate and run are independent. The estimate counts what a rank
keeps (weights, gradients, optimizer state, saved activations); the run recorded torch's
max_memory_allocated, which also holds what a step allocates and frees on the way.
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
            "--global-batch-size", m["global_batch_size"], "--vocab-size", m["vocab_size"], "--bf16",
            # scripts/bench_gpu.py's megatron_flags: no dropout, so no masks are kept
            "--hidden-dropout", "0", "--attention-dropout", "0"]
    args = validate_pretrain([str(a) for a in argv], 1)
    build_tokenizer(args)
    mfu, source = recorded_mfu()
    costs = report_theoretical_memory(args)
    t = iteration_time(args, costs, BUILT_IN["h100"], mfu)
    recorded = run["results"]["minitron"]["ms_per_iteration"]
    print(f"model: {m['num_layers']} layers, hidden {m['hidden_size']}, seq {m['seq_length']}, "
          f"micro-batch {m['micro_batch_size']}, global batch {m['global_batch_size']}, one GPU")
    print(f"FLOPs per iteration: estimate {t['flops_per_iteration']:.6g}, recorded {run['flops_per_iteration']:.6g}"
          f" ({'the same count' if t['flops_per_iteration'] == run['flops_per_iteration'] else 'DIFFERENT'})")
    print(f"at MFU {mfu:.2%} ({source}):")
    print(f"  estimate {t['iteration_s'] * 1e3:,.0f} ms per iteration, recorded {recorded:,.0f} ms "
          f"({t['iteration_s'] * 1e3 / recorded - 1:+.2%})")
    kept = sum(costs[0].memory.values()) / 2**30
    peak = run["results"]["minitron"]["peak_memory_gib"]
    print(f"memory: estimate {kept:.1f} GiB kept, recorded peak {peak:.1f} GiB allocated "
          f"({kept / peak - 1:+.1%})")


if __name__ == "__main__":
    main()
