"""--use-torch-fsdp2 (issue #37): torch's own FSDP2 (fully_shard) over the data-parallel ranks.

Names and defaults are Megatron 0.19.2's. validate_torch_fsdp2_args refuses, in one line each
and before any process starts, what Megatron's validate_args refuses with the flag, and what
minitron's wrapper (core/distributed/torch_fully_sharded_data_parallel.py) does not build.
Torch-free.
"""

from __future__ import annotations

import os

from minitron.training.argument_errors import require
from minitron.training.arguments_policy import note_no_effect

FLAG = "--use-torch-fsdp2"


def add_torch_fsdp2_args(parser) -> None:
    g = parser.add_argument_group("torch FSDP2")
    g.add_argument(FLAG, action="store_true",
                   help="shard the model over the data-parallel ranks with torch's fully_shard: parameters, "
                        "gradients and optimizer state become DTensors of each rank's rows; each transformer "
                        "layer is gathered just before it runs")
    g.add_argument("--torch-fsdp2-no-reshard-after-forward", action="store_false",
                   dest="torch_fsdp2_reshard_after_forward",
                   help="keep each layer gathered from its forward until its backward (FSDP2's ZeRO-2): "
                        "one all-gather per layer per micro-batch instead of two")


def validate_torch_fsdp2_args(args) -> None:
    if not args.use_torch_fsdp2:
        return
    # Two ways to shard at once.
    require(not args.use_megatron_fsdp, f"{FLAG} and --use-megatron-fsdp are two ways to shard: drop one")
    require(not getattr(args, "deepspeed", False), f"{FLAG} and --deepspeed are two ways to shard: drop one")
    # Megatron's rules, in its order.
    require(args.pipeline_model_parallel_size == 1,
            f"{FLAG} is not supported with pipeline parallelism: use --pipeline-model-parallel-size 1")
    require(getattr(args, "expert_model_parallel_size", 1) == 1,
            f"{FLAG} is not supported with expert parallelism: use --expert-model-parallel-size 1")
    require(not args.use_distributed_optimizer, f"{FLAG} shards the optimizer state itself; drop "
            "--use-distributed-optimizer (Megatron refuses the two together)")
    require("--no-gradient-accumulation-fusion" in (args.no_effect or ()), f"{FLAG} needs "
            "--no-gradient-accumulation-fusion (Megatron's fused accumulation writes into DDP's main_grad, "
            "which FSDP2's DTensor gradients do not have): add it")
    require(args.ckpt_format == "torch_dist", f"{FLAG} requires --ckpt-format torch_dist (Megatron's rule; "
            "torch_dcp is not built here)")
    require(args.untie_embeddings_and_output_weights, f"{FLAG} requires --untie-embeddings-and-output-weights "
            "(the tied matrix would sit in two units, the embedding and the root)")
    require(not args.fp16, f"{FLAG} is not supported with --fp16 (Megatron's rule): use --bf16")
    if args.distributed_backend == "nccl":   # CUDA streams only: gloo ranks have no connections to count
        require(os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1", f"{FLAG} overlaps its collectives on "
                "their own CUDA streams, which CUDA_DEVICE_MAX_CONNECTIONS=1 serializes: unset it")
    # What minitron's wrapper does not build.
    require(not getattr(args, "check_weight_hash_across_dp_replicas_interval", None), "--check-weight-hash-across-"
            f"dp-replicas-interval compares whole weights across dp, which {FLAG} does not keep (each rank holds "
            "its rows): drop it")
    # FSDP2 decides itself when its reductions run (each unit's, right after its backward), and
    # DDP's bucketed overlap is not used with it: the header says so.
    if args.overlap_grad_reduce:
        note_no_effect(args, f"--overlap-grad-reduce (with {FLAG}): FSDP2 reduce-scatters each unit as soon as "
                       "its backward is done, whatever this flag says")
