"""validate_args' checks of the parallel layout (Megatron's _add_distributed_args group): how the
tensor-, pipeline-, context- and expert-parallel sizes and the virtual pipeline tile the world,
and what they imply (the data-parallel size, the expert layout, sequence parallelism off at tp 1).

Megatron checks these inline in its validate_args; here they have a file of their own, beside
arguments_pipeline_split.py (an uneven pipeline, checked whole). Torch-free, as the command line
runs them before any rank starts.
"""

from __future__ import annotations

from minitron.core.rank_generator import DEFAULT_ORDER, TP_PP_DP_ORDER, validate_parallel_sizes
from minitron.training.argument_groups import ArgumentError, require
from minitron.training.arguments_pipeline_split import uneven_split, validate_pipeline_split


def validate_layout(args):
    """The layout's sizes against the world and the layers; fills in dp, the expert layout, vp."""
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    args.order = TP_PP_DP_ORDER if args.use_tp_pp_dp_mapping else DEFAULT_ORDER
    ep = args.expert_model_parallel_size
    if args.num_experts == 0:
        args.num_experts = None  # as Megatron: zero experts is a dense model
    if ep > 1:  # Megatron's condition: expert parallelism splits experts, so there must be some
        require(args.num_experts is not None,
                 f"--expert-model-parallel-size {ep} spreads experts over ranks, but there are none: "
                 f"add --num-experts N (a multiple of {ep})")
        require(args.num_experts % ep == 0,
                 f"--num-experts {args.num_experts} is not a multiple of --expert-model-parallel-size {ep}")

    # Virtual pipeline (interleaved schedule): several model chunks per pipeline rank.
    uneven = uneven_split(args)   # an uneven split is checked, whole, by validate_pipeline_split below
    require(args.num_layers % pp == 0 or args.hybrid_layer_pattern is not None or uneven,   # '|' may cut unevenly
             f"--num-layers {args.num_layers} is not divisible by --pipeline-model-parallel-size {pp}")
    if args.num_layers_per_virtual_pipeline_stage is not None:
        n = args.num_layers_per_virtual_pipeline_stage   # the embedding / loss may count as layers (Megatron)
        per_stage = (args.num_layers + args.account_for_embedding_in_pipeline_split
                     + args.account_for_loss_in_pipeline_split) // pp
        require(args.virtual_pipeline_model_parallel_size is None,
                 "give --num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank, "
                 "not both")
        require(per_stage % n == 0, f"the {per_stage} layers of each pipeline stage are not divisible by "
                 f"--num-layers-per-virtual-pipeline-stage {n}")
        args.virtual_pipeline_model_parallel_size = per_stage // n
    vp = args.virtual_pipeline_model_parallel_size

    # How the sizes tile the world: the rules' one home, shared with `minitron groups` and
    # initialize_model_parallel.
    try:
        sizes = validate_parallel_sizes(args.world_size, tp, pp, cp, ep, args.expert_tensor_parallel_size, vp,
                                        args.order)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    args.data_parallel_size = sizes["dp"]
    args.expert_tensor_parallel_size, args.expert_data_parallel_size = sizes["expert_tp"], sizes["expert_dp"]
    if tp == 1:
        args.sequence_parallel = False  # as Megatron: nothing to split the sequence across
    if vp is not None:
        require(args.num_layers % (pp * vp) == 0 or args.hybrid_layer_pattern is not None or uneven,
                 f"--num-layers {args.num_layers} is not divisible by pipeline x virtual pipeline "
                 f"= {pp} x {vp} = {pp * vp}")
        if vp == 1:
            args.virtual_pipeline_model_parallel_size = None  # one chunk per rank: no interleaving
    if uneven:
        validate_pipeline_split(args)
