"""The flags Megatron's CI configurations and launch scripts pass almost everywhere, that
minitron implements: what the log line adds, how garbage is collected, how a resumed schedule is
reconciled, bit-exact runs, the nan check, the padded vocabulary and the recomputed modules.

Names, destinations and defaults are Megatron 0.19.2's (its LoggerConfig, TrainingConfig,
SchedulerConfig, TokenizerConfig, TransformerConfig and RerunStateMachineConfig fields become
these flags there). validate_ci_args is their part of validate_args: torch-free, each refusal one
line. The flags minitron accepts without effect are in arguments_policy.py.
"""

from __future__ import annotations

import os

from minitron.training.argument_errors import require
from minitron.training.arguments_policy import note_no_effect
from minitron.training.arguments_ranges import COUNT, POSITIVE

# Megatron's selective recomputation units (TransformerConfig's allowed recompute_modules).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
                     "gdn_norm_out")
# The ones minitron recomputes (tensor_parallel.checkpoint around the submodule, as Megatron's):
# attention.py's core attention, transformer_layer.py's dense MLP, moe_layer.py's shared experts.
RECOMPUTED = ("core_attn", "mlp", "shared_experts")

# What --deterministic-mode sets when unset, and the values it accepts when set (Megatron's
# training/determinism.py): the libraries read them when first used, so a rank sets them before
# it joins the world. None of them changes a CPU run; a GPU rank's NCCL and cuBLAS read them.
DETERMINISM_ENV = {"NCCL_ALGO": "Ring", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
_ACCEPTED_ENV = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": ("0",), "CUBLAS_WORKSPACE_CONFIG": (":4096:8", ":16:8")}
_ACCEPTED_NCCL_ALGOS = ("Ring", "CollnetDirect", "CollnetChain", "^NVLS")   # Tree's order can vary between runs


def add_ci_args(parser) -> None:
    g = parser.add_argument_group("logging and run hygiene (Megatron's CI flags)")
    g.add_argument("--log-params-norm", action="store_true",
                   help="add the L2 norm of all parameters (each counted once over tp, pp and ep) to the "
                        "iteration line and record: 'params norm'")
    g.add_argument("--log-num-zeros-in-grad", action="store_true",
                   help="add the number of gradient entries that are exactly zero: 'num zeros'")
    g.add_argument("--no-check-for-nan-in-loss-and-grad", dest="check_for_nan_in_loss_and_grad",
                   action="store_false",
                   help="skip the check that stops a run when a gradient bucket holds NaN or Inf before "
                        "the data-parallel reduction (on by default, off for fp16 with a dynamic loss scale, "
                        "whose scaler expects them)")
    g.add_argument("--manual-gc", action="store_true",
                   help="turn Python's automatic garbage collector off while training; collect at the start, "
                        "every --manual-gc-interval iterations and around each evaluation, on every rank at "
                        "the same point")
    g.add_argument("--manual-gc-interval", type=COUNT, default=0, metavar="N",
                   help="with --manual-gc: collect every N iterations (0: only at the start and evaluations)")
    g.add_argument("--no-manual-gc-eval", dest="manual_gc_eval", action="store_false",
                   help="with --manual-gc: no collection around evaluations")
    g.add_argument("--deterministic-mode", action="store_true",
                   help="bit-identical runs: torch.use_deterministic_algorithms(True) on every rank, and "
                        "NCCL_ALGO=Ring, CUBLAS_WORKSPACE_CONFIG=:4096:8, NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 "
                        "unless set (refused: --cross-entropy-loss-fusion, a non-deterministic value of those)")
    g.add_argument("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler",
                   dest="use_checkpoint_opt_param_scheduler", action="store_true",
                   help="--load: take the learning-rate and weight-decay schedule from the checkpoint "
                        "(by default a schedule that differs from the checkpoint's stops the run)")
    g.add_argument("--override-opt_param-scheduler", "--override-opt-param-scheduler",
                   dest="override_opt_param_scheduler", action="store_true",
                   help="--load: take the schedule from these flags, not the checkpoint")
    g.add_argument("--padded-vocab-size", type=POSITIVE, default=None, metavar="N",
                   help="the embedding's and output layer's rows, instead of the tokenizer's vocabulary padded "
                        "to --make-vocab-size-divisible-by x tp (at least the vocabulary, a multiple of tp)")
    g.add_argument("--recompute-modules", nargs="*", default=None, choices=RECOMPUTE_MODULES, metavar="MODULE",
                   help="with --recompute-granularity selective: what to recompute (default core_attn; "
                        "minitron recomputes core_attn, mlp and shared_experts, the others are listed as no effect)")
    g.add_argument("--moe-layer-recompute", action="store_true",
                   help="Megatron's older spelling of --recompute-granularity selective --recompute-modules "
                        "core_attn moe")


def validate_ci_args(args) -> None:
    """These flags' rules between flags; before validate_modern_options, which checks the
    recomputation this may switch on."""
    if args.fp16 and args.loss_scale is None:
        # As Megatron: a dynamic loss scale meets Inf and NaN gradients on purpose (it backs off).
        args.check_for_nan_in_loss_and_grad = False
    require(not (args.use_checkpoint_opt_param_scheduler and args.override_opt_param_scheduler),
            "--use-checkpoint-opt_param-scheduler and --override-opt_param-scheduler exclude each other: "
            "the schedule comes from the checkpoint or from the flags")
    if args.padded_vocab_size is not None:
        tp = args.tensor_model_parallel_size
        require(args.padded_vocab_size % tp == 0, f"--padded-vocab-size {args.padded_vocab_size} is not divisible "
                f"by --tensor-model-parallel-size {tp}: each tensor-parallel rank holds whole vocabulary rows")
        if args.tokenizer_type == "NullTokenizer" and args.vocab_size is not None:   # known before any rank
            require(args.padded_vocab_size >= args.vocab_size + 1, f"--padded-vocab-size {args.padded_vocab_size} "
                    f"is smaller than NullTokenizer's vocabulary ({args.vocab_size} + the end-of-document id)")
    for flag, asked in (("--log-params-norm", args.log_params_norm), ("--log-num-zeros-in-grad",
                                                                        args.log_num_zeros_in_grad)):
        require(not (asked and args.deepspeed), f"{flag} reads Megatron's model chunks and optimizer; the "
                "--deepspeed engine's are its own: drop one of them")
    _validate_recompute_modules(args)
    if args.deterministic_mode:
        _validate_deterministic(args)


def _validate_recompute_modules(args) -> None:
    notes = []
    if args.moe_layer_recompute:   # Megatron's rewrite of the older flag
        require(args.recompute_granularity != "full",
                "--moe-layer-recompute is selective recomputation: drop it or --recompute-granularity full")
        args.recompute_granularity = "selective"
        args.recompute_modules = list(args.recompute_modules or ["core_attn"])
        if "moe" not in args.recompute_modules:
            args.recompute_modules.append("moe")
    if args.recompute_granularity == "selective" or args.recompute_activations:
        modules = args.recompute_modules if args.recompute_modules is not None else ["core_attn"]
        # Megatron's TransformerConfig conditions, each where the module does not exist
        require("moe_act" not in modules or args.moe_grouped_gemm,
                "--recompute-modules moe_act: Megatron recomputes the experts' activation only with --moe-grouped-gemm")
        require("mla_up_proj" not in modules or args.multi_latent_attention,
                "--recompute-modules mla_up_proj: Megatron recomputes MLA's up projections only with "
                "--multi-latent-attention")
        require("gdn_norm_out" not in modules, "--recompute-modules gdn_norm_out: the gated delta net's output "
                "norm, a layer minitron does not build; drop it")
        args.recompute_modules = modules
        # Those Megatron recomputes with its output-discarding checkpoint (layernorm, moe_act,
        # mla_up_proj) or around the router's counters (moe) cost memory only: kept, and said so.
        others = [m for m in modules if m not in RECOMPUTED]
        if others:
            notes.append(f"--recompute-modules {' '.join(others)}: kept, not recomputed (minitron recomputes "
                         f"{', '.join(RECOMPUTED)}); memory only, the same gradients")
    note_no_effect(args, *notes)


def _validate_deterministic(args) -> None:
    # Megatron's one flag that --deterministic-mode refuses among those minitron has: the fused
    # cross entropy (its compiled reduction's order is not fixed).
    require(not args.cross_entropy_loss_fusion,
            "--deterministic-mode needs the unfused cross entropy: drop --cross-entropy-loss-fusion")
    algo = os.environ.get("NCCL_ALGO")
    if algo is not None:
        tokens = [t.strip() for t in algo.split(",") if t.strip()]
        require(tokens and all(t in _ACCEPTED_NCCL_ALGOS for t in tokens),
                f"--deterministic-mode: NCCL_ALGO={algo!r} is not deterministic; unset it or use "
                f"{', '.join(_ACCEPTED_NCCL_ALGOS)}")
    for name, accepted in _ACCEPTED_ENV.items():
        value = os.environ.get(name)
        require(value is None or value in accepted,
                f"--deterministic-mode: {name}={value!r} is not deterministic; unset it or use {' or '.join(accepted)}")


def apply_deterministic_mode() -> None:
    """A rank's half of --deterministic-mode, before it joins the world: the environment's
    defaults, then torch's switch (ops without a deterministic kernel raise instead of running)."""
    import torch   # lazy: the flags and their checks above are read before any rank, without torch

    for name, value in DETERMINISM_ENV.items():
        os.environ.setdefault(name, value)
    torch.use_deterministic_algorithms(True)
