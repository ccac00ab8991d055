"""Megatron's flags that change when or where gradients, pipeline messages and checkpoint bytes
travel, not their values (issue #36: each blocks several of Megatron's CI configurations).

Names, destinations and defaults are Megatron 0.19.2's (DistributedDataParallelConfig,
TransformerConfig and CheckpointConfig fields become these flags there). minitron keeps them on
``args`` and lists the ones given once in the run's header, each with the reason it changes
nothing in what minitron computes (``args.no_effect_notes``). validate_overlap_args checks
Megatron's rules between them: torch-free, each refusal one line.
"""

from __future__ import annotations

from minitron.training.argument_errors import require
from minitron.training.arguments_policy import note_no_effect
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
    "tp_comm_overlap": (False, "--tp-comm-overlap",
        "overlaps the tensor-parallel all-gathers and reduce-scatters with the GEMMs (Transformer Engine's "
        "userbuffers); the same products and sums"),
    "overlap_param_gather_with_optimizer_step": (False, "--overlap-param-gather-with-optimizer-step",
        "starts the first model chunk's parameter all-gather inside the optimizer step; the same parameters"),
    "overlap_moe_expert_parallel_comm": (False, "--overlap-moe-expert-parallel-comm",
        "overlaps one micro-batch's expert all-to-all with another's compute; the same tokens to the same experts"),
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
    g.add_argument("--tp-comm-overlap", action="store_true",
                   help="(no effect here) overlap tensor-parallel communication with the GEMMs; needs "
                        "--sequence-parallel (Megatron's rule)")
    g.add_argument("--overlap-param-gather-with-optimizer-step", action="store_true",
                   help="(no effect here) start the parameter all-gather inside the optimizer step")
    g.add_argument("--overlap-moe-expert-parallel-comm", action="store_true",
                   help="(no effect here) overlap the experts' all-to-all with another micro-batch's compute")
    g.add_argument("--async-strategy", default=None, choices=("nvrx", "mcore"),
                   help="(no effect here) --async-save's writer (Megatron: nvrx, or mcore without --async-save)")
    g.add_argument("--async-ckpt-use-cpu-shm", action="store_true",
                   help="(no effect here) --async-save's tensors through CPU shared memory")


def validate_overlap_args(args) -> None:
    n = args.num_distributed_optimizer_instances
    dp_cp = args.data_parallel_size * args.context_parallel_size
    require(dp_cp % n == 0, f"--num-distributed-optimizer-instances {n} does not divide data x context parallel "
            f"size {dp_cp} (Megatron's rule: each instance is a group of whole data-parallel ranks)")
    # Megatron's rules for the overlaps (its validate_args and TransformerConfig), as it words them.
    require(not args.tp_comm_overlap or args.sequence_parallel, "--tp-comm-overlap overlaps the communication of "
            "sequence parallelism: add --sequence-parallel (with --tensor-model-parallel-size > 1)")
    if args.overlap_param_gather_with_optimizer_step:
        require(args.use_distributed_optimizer and args.overlap_param_gather,
                "--overlap-param-gather-with-optimizer-step needs --use-distributed-optimizer --overlap-param-gather")
        require(args.virtual_pipeline_model_parallel_size is not None, "--overlap-param-gather-with-optimizer-step "
                "is for the interleaved pipeline: add --num-layers-per-virtual-pipeline-stage")
        require(args.ckpt_format == "torch", "--overlap-param-gather-with-optimizer-step does not work with "
                "distributed checkpoints in Megatron: add --ckpt-format torch")
    if args.overlap_moe_expert_parallel_comm:
        _validate_moe_overlap(args)
    notes = [f"{flag}: {why}" for dest, (default, flag, why) in _NO_EFFECT.items() if getattr(args, dest) != default]
    note_no_effect(args, *notes)


def _validate_moe_overlap(args) -> None:
    flag = "--overlap-moe-expert-parallel-comm"
    require(args.pipeline_model_parallel_size == 1 or args.virtual_pipeline_model_parallel_size is not None,
            f"{flag} with pipeline parallelism needs the interleaved schedule: add --num-layers-per-virtual-"
            "pipeline-stage")
    require(args.expert_model_parallel_size > 1, f"{flag} overlaps expert parallelism's all-to-all: add "
            "--expert-model-parallel-size > 1")
    require(args.moe_token_dispatcher_type == "alltoall", f"{flag} needs --moe-token-dispatcher-type alltoall or flex")
    require(args.recompute_granularity != "full" and args.recompute_method is None
            and args.recompute_num_layers is None and "moe" not in (args.recompute_modules or ()),
            f"{flag} does not work with full recomputation or with --recompute-modules moe (Megatron's rule)")
    require(args.bf16 or args.fp16, f"{flag} is for --bf16 or --fp16 models (Megatron's rule)")
    require("--moe-shared-expert-overlap" not in (getattr(args, "no_effect", None) or ()),
            f"{flag} and --moe-shared-expert-overlap exclude each other (Megatron's rule)")
    require(getattr(args, "mtp_num_layers", None) in (None, 0, 1), f"{flag} takes at most one MTP layer")
