"""Megatron's flags that change when or where gradients, pipeline messages and checkpoint bytes
travel, not their values (issue #36: each blocks several of Megatron's CI configurations).

Names, destinations and defaults are Megatron 0.19.2's (DistributedDataParallelConfig,
TransformerConfig and CheckpointConfig fields become these flags there). minitron keeps them on
``args`` and lists the ones given once in the run's header, each with the reason it changes
nothing in what minitron computes (``args.no_effect_notes``). validate_overlap_args checks
Megatron's rules between them: torch-free, each refusal one line.
"""

from __future__ import annotations

from minitron.training.arguments_ranges import COUNT, POSITIVE

# dest -> (the value that is Megatron's default, the flag, why it changes nothing here)
_NO_EFFECT = {
    "num_distributed_optimizer_instances": (1, "--num-distributed-optimizer-instances",
        "shards the distributed optimizer's state within N groups of the data-parallel ranks and all-reduces "
        "gradients between the groups; every rank still updates with the mean gradient of all data-parallel "
        "ranks, so memory and traffic change, not the step; minitron shards over all of them"),
    "ddp_average_in_collective": (False, "--ddp-average-in-collective",
        "divides the gradients by the data-parallel size inside the reduction (an averaging all-reduce) instead "
        "of before it: the same mean gradient, divided at another point"),
    "overlap_p2p_comm_warmup_flush": (False, "--overlap-p2p-communication-warmup-flush",
        "overlaps the pipeline's sends and receives of its warmup and flush phases with compute; the same "
        "activations arrive"),
    "defer_embedding_wgrad_compute": (False, "--defer-embedding-wgrad-compute",
        "postpones the output layer's weight-gradient matmuls of the last pipeline stage to overlap them with "
        "the pipeline's flush; the same gradient, computed later"),
    "async_strategy": (None, "--async-strategy",
        "chooses --async-save's background writer (nvrx or mcore); minitron writes checkpoints before the next step"),
    "async_ckpt_use_cpu_shm": (False, "--async-ckpt-use-cpu-shm",
        "copies the tensors into CPU shared memory for --async-save's background writer; minitron has none"),
}


def add_overlap_args(parser) -> None:
    g = parser.add_argument_group("where gradients, pipeline messages and checkpoints travel (Megatron's; "
                                  "no effect here)")
    g.add_argument("--num-distributed-optimizer-instances", type=POSITIVE, default=1, metavar="N",
                   help="(no effect here) the distributed optimizer's state sharded within N groups of data-parallel "
                        "ranks")
    g.add_argument("--ddp-average-in-collective", action="store_true",
                   help="(no effect here) average gradients inside the data-parallel reduction")
    g.add_argument("--overlap-p2p-communication-warmup-flush", dest="overlap_p2p_comm_warmup_flush",
                   action="store_true", help="(no effect here) overlap the pipeline's warmup and flush messages")
    g.add_argument("--defer-embedding-wgrad-compute", action="store_true",
                   help="(no effect here) postpone the last stage's output-layer weight gradients")
    g.add_argument("--wgrad-deferral-limit", type=COUNT, default=0, metavar="N",
                   help="(no effect here) with --defer-embedding-wgrad-compute: how many micro-batches' "
                        "gradients to postpone (0: all)")
    g.add_argument("--async-strategy", default=None, choices=("nvrx", "mcore"),
                   help="(no effect here) --async-save's writer (Megatron: nvrx, or mcore without --async-save)")
    g.add_argument("--async-ckpt-use-cpu-shm", action="store_true",
                   help="(no effect here) --async-save's tensors through CPU shared memory")


def validate_overlap_args(args) -> None:
    from minitron.training.argument_groups import require   # the module that imports this one

    n = args.num_distributed_optimizer_instances
    dp_cp = args.data_parallel_size * args.context_parallel_size
    require(dp_cp % n == 0, f"--num-distributed-optimizer-instances {n} does not divide data x context parallel "
            f"size {dp_cp} (Megatron's rule: each instance is a group of whole data-parallel ranks)")
    notes = [f"{flag}: {why}" for dest, (default, flag, why) in _NO_EFFECT.items() if getattr(args, dest) != default]
    args.no_effect_notes = [*(getattr(args, "no_effect_notes", None) or ()), *notes]
