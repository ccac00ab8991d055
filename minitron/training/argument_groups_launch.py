"""More of the flags Megatron's launch scripts and CI configurations pass (issue #36): query-key
layer scaling, the rerun state machine's mode, CUDA graphs, the TikTokenizer's two flags,
--trust-remote-code and the wandb entity.

Names, destinations, choices and defaults are Megatron 0.19.2's (TransformerConfig,
RerunStateMachineConfig, TokenizerConfig and LoggerConfig fields become these flags there).
--apply-query-key-layer-scaling is implemented (core/transformer/qk_layer_scaling.py), the
tiktoken flags are read by tokenizer/tiktoken_tokenizer.py; the others choose how a step is run
or watched, not what it computes, and are listed once in the run's header as having no effect
here (``args.no_effect_notes``). validate_launch_args is their part of validate_args:
torch-free, each refusal one line.
"""
from __future__ import annotations

from minitron.training.argument_errors import require
from minitron.training.arguments_policy import note_no_effect
from minitron.training.arguments_ranges import COUNT, POSITIVE, int_in

CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")   # Megatron's CudaGraphModule
RERUN_MODES = ("disabled", "validate_results", "report_stats")

_CUDA_GRAPH = ("records the step's GPU kernels once and replays them (a launch-overhead saving); the kernels "
               "and their numbers are the same, and minitron runs the eager torch ops")
_RERUN = ("re-runs a step whose loss is NaN, Inf or a spike, to tell a GPU fault from the model's own; a rerun "
          "computes the same step again, and minitron's --check-for-nan-in-loss-and-grad stops on NaN as Megatron "
          "does when the rerun repeats it")


def add_launch_args(parser) -> None:
    g = parser.add_argument_group("attention scaling, rerun mode, CUDA graphs, wandb entity (Megatron's)")
    g.add_argument("--apply-query-key-layer-scaling", action="store_true",
                   help="scale q k^T by 1/layer-number before the scores are stored in the training dtype, and "
                        "back by layer-number in fp32 before the softmax (fp16's range); attention runs unfused")
    g.add_argument("--disable-bf16-reduced-precision-matmul", action="store_true",
                   help="with --bf16: cuBLAS sums each bf16 matmul's products in fp32 throughout "
                        "(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False); GPU only")
    g.add_argument("--moe-flex-dispatcher-backend", default="deepep", choices=("deepep", "hybridep", "ncclep"),
                   help="--moe-token-dispatcher-type flex: whose all-to-all kernels carry the tokens (run here as "
                        "minitron's alltoall)")
    g.add_argument("--rerun-mode", default="validate_results", choices=RERUN_MODES,
                   help="Megatron's rerun state machine: validate_results (its default) "
                        + _RERUN + "; disabled: none; report_stats is refused")
    g.add_argument("--cuda-graph-impl", default="none", choices=CUDA_GRAPH_IMPLS,
                   help="(no effect here) capture CUDA graphs: " + _CUDA_GRAPH)
    g.add_argument("--enable-cuda-graph", action="store_true",
                   help="(no effect here) Megatron's older spelling of --cuda-graph-impl local")
    g.add_argument("--external-cuda-graph", action="store_true",
                   help="(no effect here) Megatron's older spelling of --cuda-graph-impl transformer_engine")
    g.add_argument("--cuda-graph-modules", nargs="*", default=None, choices=CUDA_GRAPH_MODULES, metavar="MODULE",
                   help="(no effect here) which parts of a layer --cuda-graph-impl captures")
    g.add_argument("--cuda-graph-warmup-steps", type=COUNT, default=3, metavar="N",
                   help="(no effect here) eager steps before the capture")
    g.add_argument("--tiktoken-pattern", default=None, choices=("v1", "v2"),
                   help="TikTokenizer: the regex that splits text before the merges (v2 when unset)")
    g.add_argument("--tiktoken-num-special-tokens", type=int_in(7, 2 ** 20, "more special ids than any vocabulary "
                                                                        "holds"),   # at least Megatron's seven named ones
                   default=1000, metavar="N", help="TikTokenizer: the special-token ids in front of the BPE ranks")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="(no effect here) let a Hugging Face tokenizer run its repository's Python")
    g.add_argument("--check-weight-hash-across-dp-replicas-interval", type=POSITIVE, default=None, metavar="N",
                   help="every N iterations, the data-parallel replicas compare hashes of their parameters and the "
                        "run stops if any differs (training/weight_hash.py)")
    g.add_argument("--test-mode", action="store_true",
                   help="(no effect here) Megatron's real-time test: the q/k layernorm weights compared across "
                        "ranks at every forward")
    g.add_argument("--eval-global-batch-size", type=POSITIVE, default=None, metavar="N",
                   help="samples per evaluation iteration (default: --global-batch-size, its final value)")
    g.add_argument("--eval-micro-batch-size", type=POSITIVE, default=None, metavar="N",
                   help="samples per evaluation micro-batch (default: --micro-batch-size)")
    g.add_argument("--wandb-entity", default=None, metavar="NAME",
                   help="(no effect here) the wandb team; minitron's log is stdout, --log-jsonl and the trace")


def validate_launch_args(args) -> None:
    notes = []
    # (Megatron's flag also forces the softmax into fp32, which minitron's always is.)
    if args.apply_query_key_layer_scaling:
        require(not args.multi_latent_attention, "--apply-query-key-layer-scaling scales the dot-product "
                "attention's scores; multi-latent attention's are its own: drop one of them")
        require(args.context_parallel_size == 1, "--apply-query-key-layer-scaling scales the unsplit attention's "
                "scores; minitron's context-parallel attention takes them unscaled: drop one of them")
    require(args.rerun_mode != "report_stats", "--rerun-mode report_stats re-runs every step to measure its "
            "run-to-run variation; minitron has no rerun state machine: use validate_results or disabled")
    if args.enable_cuda_graph or args.external_cuda_graph:
        # Megatron's rules for its deprecated spellings.
        require(args.cuda_graph_impl == "none",
                "do not use --enable-cuda-graph or --external-cuda-graph with --cuda-graph-impl")
        require(not (args.enable_cuda_graph and args.external_cuda_graph),
                "--enable-cuda-graph and --external-cuda-graph exclude each other")
        args.cuda_graph_impl = "local" if args.enable_cuda_graph else "transformer_engine"
    if args.cuda_graph_impl != "none":
        notes.append(f"--cuda-graph-impl {args.cuda_graph_impl}: {_CUDA_GRAPH}")
    _validate_flex_dispatcher(args, notes)
    _validate_eval_batch(args)
    if args.trust_remote_code:
        notes.append("--trust-remote-code: lets a Hugging Face tokenizer run its repository's own Python; "
                     "minitron reads tokenizer.json through the tokenizers package and runs no repository code")
    if args.test_mode:
        notes.append("--test-mode: compares the q/k layernorm weights across data- and tensor-parallel ranks at "
                     "every forward, to catch a silently corrupted rank; a check, not a computation (minitron does "
                     "not make it; --check-weight-hash-across-dp-replicas-interval compares every weight)")
    if args.wandb_entity is not None:
        notes.append("--wandb-entity: a logger minitron lacks; its log is stdout, --log-jsonl and the trace")
    if args.disable_bf16_reduced_precision_matmul and not args.bf16:   # Megatron applies it with bf16 only
        notes.append("--disable-bf16-reduced-precision-matmul: acts on bf16 matmuls, and this run is not --bf16")
    note_no_effect(args, *notes)


def _validate_flex_dispatcher(args, notes: list) -> None:
    """Megatron's flex dispatcher sends the same rows to the same experts as its alltoall and
    combines them with the same weights; DeepEP, HybridEP and NCCL EP are the kernels that move
    them (over one tp x ep group, a token sent once per rank). Its rules are checked as Megatron
    checks them; then it runs as alltoall."""
    backend = args.moe_flex_dispatcher_backend
    require(backend != "ncclep" or args.moe_token_dispatcher_type == "flex",
            "--moe-flex-dispatcher-backend ncclep needs --moe-token-dispatcher-type flex (Megatron's rule)")
    if args.moe_token_dispatcher_type != "flex":
        return
    require(not (args.moe_pad_expert_input_to_capacity and backend == "deepep"),
            "--moe-token-dispatcher-type flex with the deepep backend does not pad to capacity (Megatron's rule): "
            "drop --moe-pad-expert-input-to-capacity or use --moe-flex-dispatcher-backend hybridep")
    tp_ep = args.tensor_model_parallel_size * args.expert_model_parallel_size
    require(backend == "hybridep" or tp_ep > 1, f"--moe-flex-dispatcher-backend {backend} needs tensor x expert "
            f"parallel size > 1 (Megatron's dispatcher asserts it), got {tp_ep}")
    args.moe_token_dispatcher_type = "alltoall"
    notes.append(f"--moe-token-dispatcher-type flex ({backend}): the same tokens to the same experts and the same "
                 "weighted sum as alltoall, moved by other kernels; minitron runs its alltoall")


def _validate_eval_batch(args) -> None:
    """Megatron's defaults and rule for the evaluation's batch (validate_args, after the training's)."""
    given = args.eval_global_batch_size is not None or args.eval_micro_batch_size is not None
    args.eval_global_batch_size = args.eval_global_batch_size or args.global_batch_size
    args.eval_micro_batch_size = args.eval_micro_batch_size or args.micro_batch_size
    if args.eval_global_batch_size is None:   # no --global-batch-size yet: validate_batch sets it later
        return
    gbs, mbs, dp = args.eval_global_batch_size, args.eval_micro_batch_size, args.data_parallel_size
    require(gbs % (mbs * dp) == 0, f"--eval-global-batch-size {gbs} is not divisible by --eval-micro-batch-size "
            f"{mbs} x data-parallel size {dp} (Megatron's rule)")
    vp, pp = args.virtual_pipeline_model_parallel_size, args.pipeline_model_parallel_size
    if given and vp is not None:   # the interleaved schedule's group-size rules, as for the training's batch
        from minitron.core.pipeline_parallel.pp_rank_microbatches import check_microbatch_group_size  # torch-free
        problem = check_microbatch_group_size(gbs // (mbs * dp), pp, args.microbatch_group_size_per_vp_stage or pp)
        require(problem is None, f"the evaluation's {gbs // (mbs * dp)} micro-batches (--eval-global-batch-size "
                f"{gbs} / (--eval-micro-batch-size {mbs} x dp {dp})): {problem}")
    require(not (given and getattr(args, "deepspeed", False)), "--eval-global-batch-size / --eval-micro-batch-size: "
            "a --deepspeed engine evaluates with its own batch: drop them")


def apply_bf16_matmul_precision(args) -> None:
    """A rank's half of --disable-bf16-reduced-precision-matmul, as Megatron's TransformerConfig
    applies it (bf16 runs only): cuBLAS may otherwise round partial sums of a bf16 matmul to bf16.
    torch's CPU matmuls never do, so a CPU run computes the same either way."""
    if getattr(args, "disable_bf16_reduced_precision_matmul", False) and args.bf16:
        import torch   # lazy: validate_launch_args and the flags above are read where torch is not loaded

        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
