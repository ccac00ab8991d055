"""Megatron-FSDP's flags (issue #37): --use-megatron-fsdp and --data-parallel-sharding-strategy.

Names and defaults are Megatron 0.19.2's. What each strategy shards is in
minitron/core/distributed/fsdp/__init__.py. validate_fsdp_args refuses, in one line each and
before any process starts, the combinations minitron's FSDP does not build yet. Torch-free.
"""

from __future__ import annotations

from minitron.core.distributed.fsdp import DEFAULT_STRATEGY, STRATEGIES
from minitron.training.argument_errors import require
from minitron.training.arguments_policy import note_no_effect


def add_fsdp_args(parser) -> None:
    g = parser.add_argument_group("Megatron-FSDP")
    g.add_argument("--use-megatron-fsdp", action="store_true",
                   help="shard the model over the data-parallel ranks as --data-parallel-sharding-strategy says, "
                        "gathering each transformer layer just before it runs")
    g.add_argument("--data-parallel-sharding-strategy", default=DEFAULT_STRATEGY, choices=STRATEGIES,
                   help="what each data-parallel rank keeps 1/dp of: nothing (no_shard), the optimizer state "
                        "(optim), and the gradients (optim_grads), and the parameters (optim_grads_params)")
    g.add_argument("--outer-dp-sharding-strategy", default="no_shard", choices=["no_shard", "optim"],
                   help="(no effect here) Hybrid FSDP (--num-distributed-optimizer-instances > 1): replicate "
                        "(no_shard) or shard the optimizer state (optim) across the outer data-parallel groups")
    dtypes = ["fp32", "bf16", "fp16", "auto"]
    g.add_argument("--megatron-fsdp-main-params-dtype", default="fp32", choices=dtypes,
                   help="the dtype of the optimizer's main copy of each shard; auto: the model's own (no copy)")
    g.add_argument("--megatron-fsdp-main-grads-dtype", default="auto", choices=dtypes,
                   help="the dtype gradients are kept and added up in; auto: fp32 with "
                        "--accumulate-allreduce-grads-in-fp32, else the model's")
    g.add_argument("--megatron-fsdp-grad-comm-dtype", default="auto", choices=dtypes,
                   help="the dtype gradients are sent and summed in by the reductions; auto: the gradients' own")
    g.add_argument("--init-model-with-meta-device", action="store_true",
                   help="build the model as shapes only (the meta device); Megatron-FSDP then builds each unit "
                        "for real, alone, and keeps this rank's shard: nothing full-size is built")


def validate_fsdp_args(args) -> None:
    meta = "--init-model-with-meta-device"
    if args.init_model_with_meta_device:
        # Megatron materializes a meta model without FSDP with uninitialized memory; here only
        # Megatron-FSDP's units build their weights, so it needs them.
        require(args.use_megatron_fsdp, f"{meta} builds the weights unit by unit inside Megatron-FSDP here: add "
                "--use-megatron-fsdp")
        require(args.data_parallel_sharding_strategy != "no_shard", f"{meta} is neither supported nor needed with "
                "--data-parallel-sharding-strategy no_shard (Megatron's rule): every rank keeps the whole model")
    if not args.use_megatron_fsdp:
        return
    flag = "--use-megatron-fsdp"
    require(not getattr(args, "deepspeed", False), f"{flag} and --deepspeed are two ways to shard: drop one "
            "(DeepSpeed's ZeRO stage 3 is --deepspeed's)")
    # Megatron's rule; --log-params-norm reads each rank's pieces (training/utils.calc_params_l2_norm)
    require(not (args.data_parallel_sharding_strategy == "optim_grads_params"
                 and getattr(args, "check_weight_hash_across_dp_replicas_interval", None)),
            "--check-weight-hash-across-dp-replicas-interval compares whole weights across replicas, which "
            "optim_grads_params does not keep (each rank holds its shards; Megatron's rule): drop it or choose "
            "another sharding strategy")
    # Megatron asserts the format whenever Megatron-FSDP is on; a run that neither saves nor
    # loads never reads it, so minitron asks for it only then.
    require(args.ckpt_format == "fsdp_dtensor" or (args.save is None and args.load is None),
            f"{flag} saves and loads its shards by parameter: add --ckpt-format fsdp_dtensor "
            f"(Megatron-FSDP's only checkpoint format), not {args.ckpt_format}")
    require(args.outer_dp_sharding_strategy == "no_shard" or args.data_parallel_sharding_strategy ==
            "optim_grads_params", "--outer-dp-sharding-strategy optim needs --data-parallel-sharding-strategy "
            "optim_grads_params (Megatron's rule)")
    # Megatron-FSDP overlaps its gathers and reductions with compute under these; minitron's units
    # gather and reduce when needed, computing the same, so the header says so. (--overlap-grad-reduce
    # also sizes the buckets outside unit modules, as Megatron's does: that part minitron follows.)
    notes = [f"{given} (with {flag}): overlaps Megatron-FSDP's collectives with compute; minitron's units "
             "gather and reduce when they are needed, the same numbers"
             + (" (its buckets of --ddp-bucket-size elements are cut as Megatron cuts them)" if grad else "")
             for given, on, grad in (("--overlap-grad-reduce", args.overlap_grad_reduce, True),
                                     ("--overlap-param-gather", args.overlap_param_gather, False)) if on]
    if args.outer_dp_sharding_strategy != "no_shard":   # as --num-distributed-optimizer-instances' note says
        notes.append("--outer-dp-sharding-strategy optim: Hybrid FSDP's sharding across its outer data-parallel "
                     "groups; minitron's units shard over all data-parallel ranks, the same step")
    note_no_effect(args, *notes)
