"""The flags of a hybrid model (Mamba-2 layers beside attention): Megatron 0.19's names.

Megatron takes ``--hybrid-layer-pattern`` and ``--spec`` in its experimental group and the
``--mamba-*`` sizes from TransformerConfig's fields; they are gathered here in one group. The
rules between them are ``validate_hybrid_args`` below, called first by validate_args since the
pattern decides --num-layers. Nothing here needs torch.
"""

from __future__ import annotations

from minitron.core.ssm.mamba_hybrid_layer_allocation import (
    check_hybrid_pattern, get_hybrid_total_layer_count, get_hybrid_total_pipeline_segment_count)
from minitron.training.argument_errors import ArgumentError
from minitron.training.arguments_ranges import POSITIVE

# --spec MODULE FUNCTION values that name Megatron's hybrid stack (the second is the name
# before 0.19 moved it; the third, its inference twin). minitron has one local stack for them.
HYBRID_STACK_SPECS = (("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"),
                      ("megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"),
                      ("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_inference_stack_spec"))


def add_hybrid_args(parser) -> None:
    g = parser.add_argument_group("hybrid models (Mamba-2)")
    g.add_argument("--hybrid-layer-pattern", default=None, metavar="PATTERN",
                   help="one symbol per layer: M Mamba, * attention, - MLP, E MoE; | between pipeline stages "
                        "(sets --num-layers; runs pretrain_hybrid)")
    g.add_argument("--hybrid-override-pattern", default=None, metavar="PATTERN",
                   help="deprecated in Megatron: forwarded to --hybrid-layer-pattern")
    g.add_argument("--spec", nargs="*", default=None, metavar="MODULE FUNCTION",
                   help="the layer spec; minitron takes Megatron's hybrid stack names (hybrid_stack_spec)")
    g.add_argument("--mamba-state-dim", type=POSITIVE, default=128, help="n: the SSM state per channel")
    g.add_argument("--mamba-head-dim", type=POSITIVE, default=64, help="p: channels per Mamba head")
    g.add_argument("--mamba-num-groups", type=POSITIVE, default=8, help="groups of heads sharing B and C")
    g.add_argument("--mamba-num-heads", type=POSITIVE, default=None,
                   help="default: 2 x hidden size / --mamba-head-dim")
    g.add_argument("--disable-mamba-mem-eff-path", dest="use_mamba_mem_eff_path", action="store_false",
                   help="Megatron's non-fused Mamba path; minitron has one path, the same numbers either way")
    g.add_argument("--is-hybrid-model", action="store_true",
                   help="TransformerConfig.is_hybrid_model; set by --hybrid-layer-pattern anyway (needs one)")
    # modelopt's flag (megatron/post_training/arguments.py), which its model configurations carry:
    # the family its builder makes. Pretraining reads the pattern, as pretrain_hybrid does.
    g.add_argument("--export-model-type", default=None, choices=["GPTModel", "HybridModel", "MambaModel"],
                   help="modelopt's model family; HybridModel (MambaModel: its old name) needs a pattern")


def _refuse(message: str):
    raise ArgumentError(message)


def mamba_num_heads(args) -> int:
    """Heads of each Mamba layer: --mamba-num-heads, else the mixer's 2 x hidden / head dim."""
    return args.mamba_num_heads or 2 * args.hidden_size // args.mamba_head_dim


def validate_hybrid_args(args) -> None:
    """Megatron's rules for a hybrid pattern, and what minitron's Mamba layers can build."""
    spec = tuple(args.spec) if args.spec else None
    if args.hybrid_override_pattern is not None:
        if args.hybrid_layer_pattern is not None:
            _refuse("--hybrid-override-pattern and --hybrid-layer-pattern cannot both be given: "
                    "keep --hybrid-layer-pattern (the other is its deprecated name)")
        args.hybrid_layer_pattern = args.hybrid_override_pattern
    pattern = args.hybrid_layer_pattern
    if pattern is None and (args.is_hybrid_model or args.export_model_type in ("HybridModel", "MambaModel")):
        flag = "--is-hybrid-model" if args.is_hybrid_model else f"--export-model-type {args.export_model_type}"
        _refuse(f"{flag} describes a hybrid model: give its layers with --hybrid-layer-pattern (e.g. M-M*-)")
    if pattern is None:
        if spec is not None and spec != ("local",):
            _refuse(f"--spec {' '.join(spec)}: minitron builds its own GPT layers (--spec local) and, with "
                    "--hybrid-layer-pattern, Megatron's hybrid stack; no other spec")
        return
    if spec is not None and spec not in HYBRID_STACK_SPECS:
        _refuse(f"--spec {' '.join(spec)} does not name Megatron's hybrid stack: use "
                f"--spec {' '.join(HYBRID_STACK_SPECS[0])} (or leave it out)")
    problem = check_hybrid_pattern(pattern)
    if problem:
        _refuse(problem)
    # As Megatron: the pattern decides the layer count; pipes decide the pipeline's cut.
    args.num_layers = get_hybrid_total_layer_count(pattern)
    pp = args.pipeline_model_parallel_size
    segments = get_hybrid_total_pipeline_segment_count(pattern)
    for flag, value in (("--num-layers-per-virtual-pipeline-stage", args.num_layers_per_virtual_pipeline_stage),
                        ("--num-virtual-stages-per-pipeline-rank", args.virtual_pipeline_model_parallel_size)):
        if value is not None:
            _refuse(f"{flag} does not go with --hybrid-layer-pattern: give the pattern a multiple of "
                    f"--pipeline-model-parallel-size segments separated by '|' (each stage's chunks)")
    if segments == 1:
        if args.num_layers % pp:
            _refuse(f"the {args.num_layers} layers of --hybrid-layer-pattern do not split evenly over "
                    f"--pipeline-model-parallel-size {pp}: mark the stages with '|'")
    elif segments % pp:
        _refuse(f"--hybrid-layer-pattern has {segments} '|' segments, not a multiple of "
                f"--pipeline-model-parallel-size {pp}")
    elif segments > pp:
        args.virtual_pipeline_model_parallel_size = segments // pp
    _validate_mamba_shape(args, pattern)


def _validate_mamba_shape(args, pattern: str) -> None:
    tp = args.tensor_model_parallel_size
    if "E" in pattern and not args.num_experts:
        _refuse("--hybrid-layer-pattern has MoE layers (E): give --num-experts N")
    if args.position_embedding_type not in ("learned_absolute", "rope", "none"):
        _refuse(f"--position-embedding-type {args.position_embedding_type} with --hybrid-layer-pattern: "
                "a hybrid model takes none (Nemotron-H's), rope or learned_absolute")
    if "M" not in pattern:
        return
    if args.mamba_num_heads is None and (2 * args.hidden_size) % args.mamba_head_dim:
        _refuse(f"2 x --hidden-size {args.hidden_size} (the Mamba layers' inner width) is not a multiple of "
                f"--mamba-head-dim {args.mamba_head_dim}: change one, or give --mamba-num-heads")
    heads, groups = mamba_num_heads(args), args.mamba_num_groups
    if heads % groups:
        _refuse(f"{heads} Mamba heads do not split into --mamba-num-groups {groups} groups")
    for what, n in (("Mamba heads", heads), ("--mamba-num-groups", groups)):
        if n % tp:
            _refuse(f"{what} {n} is not divisible by --tensor-model-parallel-size {tp}: each rank owns whole "
                    "heads and groups")
    if args.context_parallel_size > 1:
        _refuse("--context-parallel-size > 1 with Mamba layers: minitron does not split a scan over ranks "
                "(Megatron's MambaContextParallel); use tensor or pipeline parallelism")


def entry_module(args) -> str:
    """The script every rank runs for these flags: Megatron has one per model family."""
    return "minitron.pretrain_hybrid" if args.hybrid_layer_pattern is not None else "minitron.pretrain_gpt"
