"""validate_args' part for an uneven pipeline split (torch-free): Megatron-Core 0.19.2's flags
--decoder-first/last-pipeline-num-layers, --account-for-embedding/loss-in-pipeline-split and
--pipeline-model-parallel-layout, checked here in one line each, before any rank starts, so
that the model (transformer_block.py) and the estimate can trust the split they are given.
The split itself: minitron/core/pipeline_parallel/layer_layout.py."""

from __future__ import annotations

from minitron.core.pipeline_parallel.layer_layout import layout_problem, parse_layout, split_problem
from minitron.training.argument_errors import ArgumentError
from minitron.training.arguments_ranges import LAYERS


def add_pipeline_split_args(parser):
    """Megatron-Core 0.19.2's flags, names and defaults."""
    g = parser.add_argument_group("pipeline split")
    # LAYERS: at least 1, Megatron's rule (split_problem repeats it with the chunks), and --num-layers' ceiling.
    g.add_argument("--decoder-first-pipeline-num-layers", type=LAYERS, default=None,
                   help="transformer layers on the first pipeline stage (default: an even split)")
    g.add_argument("--decoder-last-pipeline-num-layers", type=LAYERS, default=None,
                   help="transformer layers on the last pipeline stage (default: an even split)")
    g.add_argument("--account-for-embedding-in-pipeline-split", action="store_true",
                   help="count the embedding as a layer: the first stage builds one transformer layer fewer")
    g.add_argument("--account-for-loss-in-pipeline-split", action="store_true",
                   help="count the loss as a layer: the last stage builds one transformer layer fewer")
    g.add_argument("--pipeline-model-parallel-layout", type=str, default=None,
                   help="the stages written out, e.g. 'Et*3|t*3L' (E embedding, t layer, m MTP layer, L loss, "
                        "| between stages); sets the model chunks per rank")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ArgumentError(message)


def uneven_split(args) -> bool:
    """True when a flag above chooses the split (the even-split checks then do not apply).
    A layout also sets the virtual pipeline size: its stages over --pipeline-model-parallel-size."""
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    accounts = args.account_for_embedding_in_pipeline_split or args.account_for_loss_in_pipeline_split
    layout = args.pipeline_model_parallel_layout
    chosen = [flag for flag, on in (("--decoder-first/last-pipeline-num-layers", first is not None or last is not None),
                                    ("--account-for-embedding/loss-in-pipeline-split", accounts),
                                    ("--pipeline-model-parallel-layout", layout is not None)) if on]
    if not chosen:
        return False
    _require(args.hybrid_layer_pattern is None, f"{chosen[0]} does not apply to --hybrid-layer-pattern: "
             f"minitron splits a hybrid model only at the pattern's '|'")
    _require(len(chosen) == 1, " and ".join(chosen[:2]) + " each choose the pipeline split: give one")
    if layout is not None:
        _require(args.num_layers_per_virtual_pipeline_stage is None and args.virtual_pipeline_model_parallel_size is None,
                 "--pipeline-model-parallel-layout sets the model chunks per rank (its stages / pipeline size): "
                 "drop --num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank")
        try:
            stages = len(parse_layout(layout))
        except ValueError as exc:
            _require(False, str(exc))
        pp = args.pipeline_model_parallel_size
        _require(stages % pp == 0, f"--pipeline-model-parallel-layout {layout!r} has {stages} stages, not a "
                 f"multiple of --pipeline-model-parallel-size {pp}")
        args.virtual_pipeline_model_parallel_size = stages // pp if stages > pp else None
    elif first is not None or last is not None:
        _require(args.num_layers_per_virtual_pipeline_stage is None,
                 "with --decoder-first/last-pipeline-num-layers give the model chunks per rank by "
                 "--num-virtual-stages-per-pipeline-rank, not --num-layers-per-virtual-pipeline-stage")
    return True


def validate_pipeline_split(args) -> None:
    """The chosen split fits --num-layers, the pipeline and its model chunks (Megatron's rules)."""
    if args.pipeline_model_parallel_layout is not None:
        problem = layout_problem(args.pipeline_model_parallel_layout, args.pipeline_model_parallel_size,
                                 args.num_layers, getattr(args, "mtp_num_layers", None))
    else:
        problem = split_problem(args.num_layers, args.pipeline_model_parallel_size,
                                args.virtual_pipeline_model_parallel_size,
                                first=args.decoder_first_pipeline_num_layers,
                                last=args.decoder_last_pipeline_num_layers,
                                embedding=args.account_for_embedding_in_pipeline_split,
                                loss=args.account_for_loss_in_pipeline_split)
    _require(problem is None, problem or "")
