"""Will the run fit? Checked before any rank starts, from the arguments alone.

A model too big for the machine used to surface as an allocator's traceback from every rank,
seconds after the launch (`--hidden-size 1000000`: "DefaultCPUAllocator: can't allocate
memory", 16 times). The accountant that `minitron estimate` prints
(training/theoretical_memory_usage.py) already knows what each rank will hold; here it is set
against what the ranks will have: this machine's available memory for gloo ranks (all of them
share it), each GPU's free memory for nccl ranks (one GPU each). The dataset's indices live in
host memory either way.
"""

from __future__ import annotations

import os
import subprocess

from minitron.cli.common import UserError
from minitron.cli.preflight import _available_mib

# What GPTDataset's indices hold per sample, built in each rank before its first step: about two
# document-index entries (int32), a sample-index pair (int32) and a shuffle entry (up to int64).
SAMPLE_INDEX_BYTES = 24
_SMALLER = "make it smaller (--num-layers, --hidden-size, --seq-length, --micro-batch-size, --vocab-size)"


def gpu_free_mib() -> list[int] | None:
    """Free MiB of each GPU this process may use, in CUDA's order; None when it cannot be told.
    nvidia-smi, not torch: torch would create a CUDA context in this parent to answer."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
        free = dict(tuple(part.strip() for part in line.split(",")) for line in out.stdout.splitlines() if line.strip())
        free = {index: int(mib) for index, mib in free.items()}
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(free.values()) if out.returncode == 0 else None
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    if out.returncode or not all(v in free for v in wanted):
        return None   # UUIDs or MIG instances: not worth guessing
    return [free[v] for v in wanted]


def check_fits(args, backend: str) -> None:
    """Refuse, quoting the figures, a run whose ranks (as the accountant works them out:
    weights, gradients, optimizer state, activations) or dataset indices do not fit."""
    # lazy: the accountant and the tokenizer (pure arithmetic, no torch) load only for a run
    # that builds a model, once its flags are valid
    from minitron.cli.views.words import human
    from minitron.training.theoretical_memory_usage import report_theoretical_memory
    from minitron.training.tokenizer import build_tokenizer

    if getattr(args, "padded_vocab_size", None) is None:
        try:
            build_tokenizer(args)  # sets padded_vocab_size, as the ranks will
        except (ValueError, OSError) as exc:
            raise UserError(str(exc)) from None
    costs, world = report_theoretical_memory(args), args.world_size
    needs = [sum(c.memory.values()) for c in costs]

    def held(rank: int) -> str:
        return ", ".join(f"{k} {human(v)}" for k, v in costs[rank].memory.items())

    on_host = 0
    if backend == "nccl":   # one GPU per rank, in local-rank order (launcher.launch)
        gpus = gpu_free_mib()
        for rank, need in enumerate(needs if gpus else []):
            free = gpus[rank % len(gpus)] * 2**20
            if need > free:
                raise UserError(f"rank {rank} needs {human(need)} on its GPU ({held(rank)}; `minitron estimate` "
                                f"shows every rank) and the GPU has {human(free)} free: {_SMALLER}, or spread it "
                                f"over more ranks")
    else:
        on_host = sum(needs)
    big = max(range(world), key=needs.__getitem__)
    mib = _available_mib()
    if mib is None:
        return
    have = mib * 2**20
    if on_host > have:
        raise UserError(f"the model needs {human(on_host)} for its {world} rank(s) here (rank {big}: {held(big)}; "
                        f"`minitron estimate` shows every rank) and this machine has {human(have)} available: "
                        f"{_SMALLER} or run it on GPUs")
    # training, validation and test samples: training/data.get_train_valid_test_num_samples'
    # sum (its module imports torch, so the three terms are written out here)
    gbs, iters = args.global_batch_size, args.train_iters or 0
    evaluations = (iters // args.eval_interval if args.eval_interval else 0) + 1
    samples = (args.train_samples or iters * gbs) + (evaluations + 1) * args.eval_iters * gbs
    index = SAMPLE_INDEX_BYTES * samples * world
    if on_host + index > have:
        most = (have - on_host) // (SAMPLE_INDEX_BYTES * world)
        raise UserError(f"{samples:,} samples to index (--train-iters {iters:,}, --eval-iters {args.eval_iters:,}, "
                        f"--global-batch-size {gbs}): each of the {world} rank(s) indexes them (~{SAMPLE_INDEX_BYTES} B "
                        f"a sample, {human(index)} in all) beside the model's {human(on_host)}, and this machine has "
                        f"{human(have)} available: at most {most:,} samples fit")
