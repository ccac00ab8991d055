"""Benchmark training throughput: minitron against a plain PyTorch loop, tracing on against off.

    python scripts/bench_training.py [--rounds 5] [--iters 12] [--threads N] [--hidden 256] ...

Both sides train the same GPT (pre-LayerNorm blocks, GeLU MLP of 4h, tied input/output
embedding, learned positions), with AdamW, the same micro-batch and the same number of
micro-batches per step, on this machine's CPU, each in a fresh process with the same number of
threads (OMP_NUM_THREADS and torch.set_num_threads). The plain loop is written here with
torch.nn alone; minitron runs as `minitron pretrain --world 1`, untraced and traced.

A shared machine is noisy, so the three runs are interleaved (plain, minitron, traced, plain,
...) for --rounds rounds. Each run's time per iteration is the median over its iterations after
the first two (warm-up); the figures printed are medians over the rounds, and the ratios are
taken both of those medians and round by round (each round's runs are close in time).

Page faults weigh on both sides: glibc returns freed heap to the system and faults it in
again, as often as the order of frees dictates, and in a virtual machine each fault can cost
far more wall time than CPU time. ``--steady-heap`` turns that off for both sides alike.

On a machine too busy for wall-clock figures, ``--paired`` runs both loops in one process,
one thread, a minitron step then a plain step, and compares CPU seconds: each step's own
thread's, plus, charged to minitron, what the process's other threads burnt meanwhile. Those
are minitron's alone (the plain loop starts none): gloo gives each process group a transport
thread that wakes every 10 ms, and a rank belongs to some twenty groups even at world 1.

What the two loops share: the model's arithmetic (same shapes, fp32, no dropout, causal
attention through torch's fused kernel, the tied output layer), AdamW (lr 1e-4, weight decay
0.01, torch's defaults otherwise), gradient clipping at norm 1.0, a fresh random micro-batch
each time. What only minitron does, as Megatron does: reads its micro-batches through the
dataset and data loader, keeps gradients in one contiguous buffer (DDP's main_grad), decays
no weight of biases and layernorms, follows the learning-rate schedule, computes the loss with
the vocabulary-parallel cross entropy (max, exp and sums instead of one log_softmax), adds the
biases of the row-parallel layers and fc1 outside their matmuls (Megatron's skip_bias_add, for
its fused kernels), and logs each iteration. Plain PyTorch adds those biases inside the matmul.

Prints: minitron / plain throughput (goal >= 0.95) and traced / untraced iteration time
(goal <= 1.05).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from plain_gpt import PlainGPT   # scripts/plain_gpt.py: the model bench_gpu.py trains too

BIN = Path(sys.executable).parent


def plain_iteration_times(o) -> list[float]:
    """The plain loop, in this process (run as a child: see ``--plain-child``)."""
    torch.manual_seed(0)
    model = PlainGPT(o.vocab, o.hidden, o.layers, o.heads, o.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    times = []
    for _ in range(o.iters):
        start = time.perf_counter()
        opt.zero_grad()
        for _ in range(o.microbatches):
            tokens = torch.randint(0, o.vocab, (o.micro, o.seq + 1), generator=g)
            loss = model(tokens[:, :-1], tokens[:, 1:]) / o.microbatches
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - start)
    return times


def child_env(o) -> dict:
    # Both sides get the same thread count: minitron's launcher reads OMP_NUM_THREADS too.
    env = {**os.environ, "OMP_NUM_THREADS": str(o.threads)}
    if o.steady_heap:
        # glibc gives freed heap memory back to the system and pages it in again later; how
        # often depends on the order of frees, not on the work. These settings (for both
        # sides) keep the heap, so that only the arithmetic and the Python around it differ.
        env.update(MALLOC_TRIM_THRESHOLD_=str(1 << 30), MALLOC_MMAP_THRESHOLD_=str(1 << 28))
    return env


def plain_run(o) -> list[float]:
    """The plain loop as one rank of `minitron launch`: a process started exactly as minitron's
    rank is (forked, its own session, the same environment and thread count). Linux's autogroup
    scheduler shares a busy machine's CPUs between sessions, so a loop started any other way
    gets a different share of the CPU than the rank it is compared with.
    """
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(BIN / "minitron"), "launch", "--world", "1", "--log-dir", tmp,
               __file__, "--plain-child", *sys.argv[1:]]
        done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(o), start_new_session=True)
        log = Path(tmp, "rank0.log").read_text() if Path(tmp, "rank0.log").exists() else ""
        if done.returncode:
            sys.exit(f"the plain loop failed:\n{done.stderr[-2000:]}{log[-2000:]}")
        return json.loads(log.strip().splitlines()[-1])


def minitron_iteration_times(o, trace: bool) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(BIN / "minitron"), "pretrain", "--world", "1", "--log-dir", f"{tmp}/logs",
               "--num-layers", str(o.layers), "--hidden-size", str(o.hidden),
               "--num-attention-heads", str(o.heads), "--seq-length", str(o.seq),
               "--micro-batch-size", str(o.micro), "--global-batch-size", str(o.micro * o.microbatches),
               "--train-iters", str(o.iters), "--lr", "1e-4", "--mock-data", "--vocab-size", str(o.vocab - 1),
               "--make-vocab-size-divisible-by", "1", "--hidden-dropout", "0", "--attention-dropout", "0"]
        if trace:
            cmd += ["--trace", f"{tmp}/trace"]
        done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(o), start_new_session=True)
        if done.returncode:
            sys.exit(f"minitron pretrain failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        records = [json.loads(line) for line in open(f"{tmp}/logs/iterations.jsonl")]
    return [r["elapsed_ms"] / 1000 for r in records]


def seconds_per_iteration(times: list[float]) -> float:
    return statistics.median(times[2:])   # the first two iterations warm up


def paired_cpu_ratio(o) -> None:
    """One process, one thread: minitron's train_step and a plain step taken in turn, each
    timed in CPU seconds (time.process_time). Nothing here waits for a CPU, so the ratio holds
    on a machine too busy for wall-clock figures; both sides share one heap and one cache.
    """
    import contextlib
    import io
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(20000 + os.getpid() % 20000))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = PlainGPT(o.vocab, o.hidden, o.layers, o.heads, o.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)

    def plain_step():
        opt.zero_grad()
        for _ in range(o.microbatches):
            tokens = torch.randint(0, o.vocab, (o.micro, o.seq + 1), generator=g)
            (model(tokens[:, :-1], tokens[:, 1:]) / o.microbatches).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    from minitron import pretrain_gpt
    from minitron.training import training
    minitron_step, pairs = training.train_step, []

    def step(*args, **kwargs):
        start, start_all = time.thread_time(), time.process_time()
        result = minitron_step(*args, **kwargs)
        middle = time.thread_time()
        plain_step()
        end, end_all = time.thread_time(), time.process_time()
        # Other threads' CPU over both steps: minitron's gloo threads (see the module docstring).
        background = max(0.0, (end_all - start_all) - (end - start))
        pairs.append((middle - start + background, end - middle, background))
        return result

    training.train_step = step
    argv = ["--num-layers", str(o.layers), "--hidden-size", str(o.hidden), "--num-attention-heads", str(o.heads),
            "--seq-length", str(o.seq), "--micro-batch-size", str(o.micro),
            "--global-batch-size", str(o.micro * o.microbatches), "--train-iters", str(o.iters), "--lr", "1e-4",
            "--mock-data", "--vocab-size", str(o.vocab - 1), "--make-vocab-size-divisible-by", "1",
            "--hidden-dropout", "0", "--attention-dropout", "0"]
    with contextlib.redirect_stdout(io.StringIO()):
        pretrain_gpt.main(argv)
    pairs = pairs[2:]
    print(f"paired, 1 thread, CPU seconds per step over {len(pairs)} steps: minitron "
          f"{statistics.median(m for m, _, _ in pairs):.3f} (of which other threads "
          f"{statistics.median(b for _, _, b in pairs):.3f}), plain {statistics.median(q for _, q, _ in pairs):.3f}; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"minitron / plain throughput (CPU time): {statistics.median(q / m for m, q, _ in pairs):.3f} "
          f"(median of pairs; {statistics.median(q / (m - b) for m, q, b in pairs):.3f} without other threads)"
          "   goal >= 0.95")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of plain, minitron, traced")
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--steady-heap", action="store_true",
                   help="both sides: glibc keeps freed memory (no page faults from heap trimming)")
    p.add_argument("--paired", action="store_true",
                   help="instead: both loops in one process, step by step, in CPU time (busy machines)")
    p.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    o = p.parse_args()
    if o.iters < 3 or o.rounds < 1:
        sys.exit("bench_training: use --iters 3 or more (two warm up) and --rounds 1 or more")
    if o.paired:
        return paired_cpu_ratio(o)
    if o.plain_child:
        torch.set_num_threads(o.threads)
        print(json.dumps(plain_iteration_times(o)))
        return

    tokens = o.micro * o.microbatches * o.seq
    params = 12 * o.layers * o.hidden ** 2 + (o.vocab + o.seq) * o.hidden
    print(f"GPT ~{params / 1e6:.1f}M params, {o.layers} layers, hidden {o.hidden}, seq {o.seq}, "
          f"micro {o.micro} x {o.microbatches} micro-batches, {o.threads} CPU threads per run, "
          f"{o.iters} iterations per run{', steady heap' if o.steady_heap else ''}")
    print(f"{'round':>5}  {'plain tok/s':>11}  {'minitron':>9}  {'traced':>9}  "
          f"{'minitron/plain':>14}  {'traced slowdown':>15}")
    rows = []
    for r in range(o.rounds):
        plain = seconds_per_iteration(plain_run(o))
        untraced = seconds_per_iteration(minitron_iteration_times(o, trace=False))
        traced = seconds_per_iteration(minitron_iteration_times(o, trace=True))
        rows.append((plain, untraced, traced))
        print(f"{r + 1:>5}  {tokens / plain:11.0f}  {tokens / untraced:9.0f}  {tokens / traced:9.0f}  "
              f"{plain / untraced:14.3f}  {traced / untraced:14.3f}x", flush=True)
    plain, untraced, traced = (statistics.median(col) for col in zip(*rows))
    print(f"median {tokens / plain:10.0f}  {tokens / untraced:9.0f}  {tokens / traced:9.0f}")
    print(f"minitron / plain throughput: {plain / untraced:.3f} (ratio of medians), "
          f"{statistics.median(p / u for p, u, _ in rows):.3f} (median of rounds)   goal >= 0.95")
    print(f"traced / untraced time:      {traced / untraced:.3f} (ratio of medians), "
          f"{statistics.median(t / u for _, u, t in rows):.3f} (median of rounds)   goal <= 1.05")


if __name__ == "__main__":
    main()
