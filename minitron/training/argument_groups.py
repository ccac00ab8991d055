"""Megatron's flags, one argument group per concern, under the names of Megatron's arguments.py.

Kept apart from parse_args/validate_args so the vocabulary (what can be said) and the
arithmetic (what must hold between the values) each read in one sitting. This is the ground
floor of the arguments: training/arguments.py and training/datasets/arguments.py both build
on it, and it imports neither, so there is no cycle; nothing it imports needs torch.
"""

from __future__ import annotations

import argparse

from minitron.core.rank_generator import DEFAULT_ORDER, TP_PP_DP_ORDER
from minitron.training.argument_errors import ArgumentError, require  # noqa: F401  (re-exported)
from minitron.training.arguments_ranges import COUNT, LAYERS, LOSS_SCALE, POSITIVE, PROBABILITY, float_in, int_in
from minitron.training.arguments_policy import add_policy_args
from minitron.training.argument_groups_fp8 import add_fp8_args
from minitron.training.argument_groups_ci import add_ci_args
from minitron.training.argument_groups_ckpt import add_ckpt_args
from minitron.training.argument_groups_fsdp import add_fsdp_args
from minitron.training.argument_groups_torch_fsdp2 import add_torch_fsdp2_args
from minitron.training.argument_groups_launch import add_launch_args
from minitron.training.argument_groups_overlap import add_overlap_args
from minitron.training.argument_groups_hybrid import add_hybrid_args
from minitron.training.arguments_pipeline_split import add_pipeline_split_args
from minitron.training.argument_groups_model import (_add_fusion_args, _add_layer_variant_args, _add_mla_args,
                                                     _add_moe_args, _add_position_embedding_args,
                                                     _add_window_args)
from minitron.training.tokenizer.tokenizer import TOKENIZER_TYPES


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and exit(2); we want one clear line
        raise ArgumentError(message)



def _add_network_size_args(parser):
    g = parser.add_argument_group("network size")
    g.add_argument("--num-layers", type=LAYERS, default=None)
    g.add_argument("--hidden-size", type=POSITIVE, default=None)
    g.add_argument("--ffn-hidden-size", type=POSITIVE, default=None, help="default: 4 x hidden size")
    g.add_argument("--num-attention-heads", type=POSITIVE, default=None)
    g.add_argument("--kv-channels", type=POSITIVE, default=None, help="default: hidden / heads")
    g.add_argument("--max-position-embeddings", type=POSITIVE, default=None, help="default: seq length")
    g.add_argument("--make-vocab-size-divisible-by", type=POSITIVE, default=128)
    # Megatron 0.19's names; the dests are TransformerConfig's fields, as Megatron's are.
    g.add_argument("--norm-epsilon", dest="layernorm_epsilon", type=float_in(0.0, above=True), default=1e-5,
                   help="epsilon of every LayerNorm / RMSNorm")
    g.add_argument("--apply-layernorm-1p", dest="layernorm_zero_centered_gamma", action="store_true",
                   help="norms scale by (1 + weight), weight starting at 0 (weight decay pulls towards 1)")
    g.add_argument("--disable-bias-linear", dest="add_bias_linear", action="store_false",
                   help="no bias in linear_qkv, linear_proj, linear_fc1, linear_fc2")
    g.add_argument("--qk-layernorm", action="store_true",
                   help="normalise each head's query and key before the scores (per-head-size norms)")
    g.add_argument("--init-method-std", type=float_in(0.0), default=0.02)
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    # The modern GPT options (LLaMA-style models are rope + swiglu + RMSNorm + GQA + untied).
    _add_position_embedding_args(g)
    _add_layer_variant_args(g)
    g.add_argument("--swiglu", action="store_true", help="gated MLP, silu(x W_gate) * (x W_up)")
    g.add_argument("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"])
    g.add_argument("--group-query-attention", action="store_true",
                   help="heads share keys and values in --num-query-groups groups")
    g.add_argument("--num-query-groups", type=POSITIVE, default=None)


def _add_regularization_args(parser):
    g = parser.add_argument_group("regularization")
    g.add_argument("--attention-dropout", type=PROBABILITY, default=0.1)
    g.add_argument("--hidden-dropout", type=PROBABILITY, default=0.1)
    g.add_argument("--weight-decay", type=float_in(0.0), default=0.01)
    g.add_argument("--clip-grad", type=float_in(0.0), default=1.0, help="0: no clipping")
    g.add_argument("--adam-beta1", type=PROBABILITY, default=0.9)
    g.add_argument("--adam-beta2", type=PROBABILITY, default=0.999)
    g.add_argument("--adam-eps", type=float_in(0.0, above=True), default=1e-8)
    g.add_argument("--sgd-momentum", type=PROBABILITY, default=0.9)


def _add_training_args(parser):
    g = parser.add_argument_group("training")
    g.add_argument("--micro-batch-size", type=POSITIVE, default=None)
    g.add_argument("--global-batch-size", type=POSITIVE, default=None,
                   help="default: micro batch size x data-parallel size")
    g.add_argument("--rampup-batch-size", nargs=3, type=COUNT, default=None, metavar=("START", "INCREMENT", "SAMPLES"),
                   help="grow the global batch over the first SAMPLES samples (needs --train-samples)")
    g.add_argument("--step-batch-size-schedule", default=None, metavar='"TOKENS:BATCH ..."',
                   help='global batch by progress, e.g. "0:16 1M:32": from 0 tokens 16, from 1M 32 (K, M, B, T '
                        "suffixes; needs --train-samples; the last batch is the global batch)")
    g.add_argument("--calculate-per-token-loss", action="store_true",
                   help="divide the summed loss by the global batch's loss tokens (over micro-batches and dp) "
                        "instead of averaging each micro-batch's mean")
    g.add_argument("--train-iters", type=COUNT, default=None, help="iterations to train (or --train-samples)")
    g.add_argument("--train-samples", type=POSITIVE, default=None,
                   help="samples to train; the iterations follow from the batch (and its ramp-up)")
    g.add_argument("--exit-interval", type=POSITIVE, default=None,
                   help="stop after an iteration divisible by N (saving first, with --save)")
    g.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    g.add_argument("--dataloader-type", default=None, choices=["single", "cyclic", "external"],
                   help="single: one pass in dataset order (default); cyclic: reshuffle every epoch")
    # Megatron lists this one among its vision flags; it steers the cyclic sampler.
    g.add_argument("--no-data-sharding", dest="data_sharding", action="store_false",
                   help="cyclic loader: one global shuffle instead of one bucket per dp rank")
    # Activation recomputation: keep fewer activations, compute them again in backward.
    g.add_argument("--recompute-activations", action="store_true",
                   help="shorthand for --recompute-granularity selective")
    g.add_argument("--recompute-granularity", default=None, choices=["full", "selective"],
                   help="full: whole layers (with --recompute-method); selective: core attention only")
    g.add_argument("--recompute-method", default=None, choices=["uniform", "block"],
                   help="uniform: every chunk of N layers; block: the first N layers of each stage")
    g.add_argument("--recompute-num-layers", type=POSITIVE, default=None, metavar="N")


def _add_initialization_args(parser):
    g = parser.add_argument_group("initialization")
    g.add_argument("--seed", type=int_in(0, 2**31 - 1), default=1234)
    g.add_argument("--data-parallel-random-init", action="store_true")
    g.add_argument("--use-cpu-initialization", action="store_true",
                   help="on GPU ranks, draw every weight whole on the CPU (the same for every tp size), then "
                        "move it; CPU ranks always draw this way")


def _add_learning_rate_args(parser):
    g = parser.add_argument_group("learning rate")
    g.add_argument("--lr", type=float_in(0.0), default=None)
    g.add_argument("--min-lr", type=float_in(0.0), default=0.0)
    g.add_argument("--lr-decay-style", default="linear",
                   choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"])
    g.add_argument("--lr-wsd-decay-style", default="exponential", choices=["exponential", "linear", "cosine", "minus_sqrt"],
                   help="WSD: how the last --lr-wsd-decay-iters/-samples anneal")
    g.add_argument("--lr-decay-iters", type=POSITIVE, default=None, help="default: --train-iters")
    g.add_argument("--lr-decay-samples", type=POSITIVE, default=None, help="default: --train-samples")
    g.add_argument("--lr-wsd-decay-iters", type=POSITIVE, default=None, help="WSD: iterations of the final anneal")
    g.add_argument("--lr-wsd-decay-samples", type=POSITIVE, default=None, help="WSD: samples of the final anneal")
    g.add_argument("--lr-warmup-fraction", type=float_in(0.0, 1.0), default=None,
                   help="warm up over this share of the decay steps")
    g.add_argument("--lr-warmup-iters", type=COUNT, default=0)
    g.add_argument("--lr-warmup-samples", type=COUNT, default=0)
    g.add_argument("--lr-warmup-init", type=float_in(0.0), default=0.0, help="the learning rate warm-up starts from")
    g.add_argument("--decoupled-lr", type=float_in(0.0), default=None,
                   help="the word embedding's and output layer's own peak learning rate")
    g.add_argument("--decoupled-min-lr", type=float_in(0.0), default=None,
                   help="... and their floor (default: --min-lr)")


def _add_mixed_precision_args(parser):
    g = parser.add_argument_group("mixed precision")
    g.add_argument("--fp16", action="store_true")
    g.add_argument("--bf16", action="store_true")
    g.add_argument("--loss-scale", type=LOSS_SCALE, default=None, help="static loss scale; default: dynamic")
    g.add_argument("--initial-loss-scale", type=LOSS_SCALE, default=2.0 ** 32)
    g.add_argument("--min-loss-scale", type=LOSS_SCALE, default=1.0)
    g.add_argument("--loss-scale-window", type=POSITIVE, default=1000)
    g.add_argument("--hysteresis", type=POSITIVE, default=2)
    g.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true")
    g.add_argument("--grad-reduce-in-bf16", action="store_true",
                   help="with --bf16: accumulate and reduce gradients in bf16 instead of the default fp32")
    add_fp8_args(g)


def _add_distributed_args(parser):
    g = parser.add_argument_group("distributed")
    g.add_argument("--tensor-model-parallel-size", type=POSITIVE, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=POSITIVE, default=1)
    g.add_argument("--num-layers-per-virtual-pipeline-stage", type=POSITIVE, default=None)
    # Megatron's current name first; older Megatron scripts use the second spelling.
    g.add_argument("--num-virtual-stages-per-pipeline-rank", "--virtual-pipeline-model-parallel-size",
                   dest="virtual_pipeline_model_parallel_size", type=POSITIVE, default=None,
                   help="model chunks per pipeline rank (the interleaved schedule)")
    g.add_argument("--microbatch-group-size-per-virtual-pipeline-stage", dest="microbatch_group_size_per_vp_stage",
                   type=POSITIVE, default=None, help="interleaved schedule: micro-batches run through a model "
                   "chunk in a row before the next chunk; default: the pipeline size")
    g.add_argument("--context-parallel-size", type=POSITIVE, default=1)
    # Megatron's four kinds; validate_args refuses the two minitron does not build, by name.
    g.add_argument("--cp-comm-type", nargs="+", default=["p2p"], choices=["p2p", "a2a", "a2a+p2p", "allgather"],
                   help="context-parallel attention: p2p (a ring of keys/values), a2a (all-to-all, heads <-> "
                        "sequence) or a2a+p2p (both, in two levels); one for all layers or one per layer")
    g.add_argument("--hierarchical-context-parallel-sizes", nargs="+", type=POSITIVE, default=None, metavar="N",
                   help="a2a+p2p's levels: all-to-all groups of the first size, a ring of the second")
    g.add_argument("--expert-model-parallel-size", type=POSITIVE, default=1)
    g.add_argument("--expert-tensor-parallel-size", type=POSITIVE, default=None, help="default: tp size")
    g.add_argument("--sequence-parallel", action="store_true")
    g.add_argument("--use-tp-pp-dp-mapping", action="store_true",
                   help=f"rank order {TP_PP_DP_ORDER} instead of {DEFAULT_ORDER}")
    g.add_argument("--distributed-backend", default=None, choices=["nccl", "gloo", "fake"],
                   help="default: nccl with GPUs, gloo without")
    # 2**31 - 1 minutes broke torch's TCP store here ("client socket has timed out"); 10**6 ran.
    g.add_argument("--distributed-timeout-minutes", type=int_in(1, 10**6, "about two years; far longer timeouts "
                                                               "break torch's TCP store"), default=10)
    g.add_argument("--use-distributed-optimizer", action="store_true")
    g.add_argument("--overlap-grad-reduce", action="store_true",
                   help="cut the gradient buffer into buckets, each reduced (async) as soon as backward fills it")
    g.add_argument("--overlap-param-gather", action="store_true",
                   help="with --use-distributed-optimizer and --overlap-grad-reduce: all-gather each "
                        "bucket's parameters during the next forward instead of at the end of the step")
    g.add_argument("--ddp-bucket-size", type=POSITIVE, default=None, metavar="ELEMENTS",
                   help="elements per gradient bucket with --overlap-grad-reduce (default max(40M, 1M x dp))")
    # DeepSpeed's launch.py passes --local_rank=N (underscore), torch.distributed.launch did too.
    g.add_argument("--local-rank", "--local_rank", type=COUNT, default=None)


def _add_deepspeed_args(parser):
    # DeepSpeed's add_config_arguments spells them with underscores; Megatron-DeepSpeed's
    # scripts pass `--deepspeed --deepspeed_config ds.json`. Both spellings are taken.
    g = parser.add_argument_group("deepspeed")
    g.add_argument("--deepspeed", action="store_true",
                   help="train through minitron.runtime's engine (DeepSpeed's initialize, ZeRO 0-3)")
    g.add_argument("--deepspeed-config", "--deepspeed_config", dest="deepspeed_config", default=None,
                   metavar="JSON", help="the ds_config; its batch triad must agree with the batch flags")
    g.add_argument("--deepspeed-activation-checkpointing", action="store_true",
                   help="checkpoint the --recompute-granularity full layers through DeepSpeed's checkpoint, "
                        "as the ds_config's activation_checkpointing section says (ZeRO-R)")


def _add_validation_args(parser):
    g = parser.add_argument_group("validation")
    g.add_argument("--eval-iters", type=COUNT, default=100, help="batches per evaluation (0: none)")
    g.add_argument("--eval-interval", type=POSITIVE, default=None,
                   help="evaluate every N iterations (default: never during training)")


def _add_logging_args(parser):
    g = parser.add_argument_group("logging")
    g.add_argument("--log-interval", type=POSITIVE, default=1)
    g.add_argument("--log-jsonl", default=None, metavar="PATH",
                   help="one JSON object per iteration, written by the rank that owns the loss")
    g.add_argument("--timing-log-level", type=int, default=0, choices=[0, 1, 2])
    g.add_argument("--log-throughput", action="store_true",
                   help="add TFLOP/s per GPU (Megatron's FLOP count) to each iteration line, and MFU where "
                        "the device's peak is known")


def _add_checkpointing_args(parser):
    g = parser.add_argument_group("checkpointing")
    g.add_argument("--save", default=None, metavar="DIR", help="save checkpoints into DIR")
    g.add_argument("--save-interval", type=POSITIVE, default=None, help="save every N iterations (and at the end)")
    g.add_argument("--load", default=None, metavar="DIR", help="resume from the latest checkpoint in DIR")
    g.add_argument("--ckpt-format", default="torch_dist", choices=["torch", "torch_dist", "fsdp_dtensor"],
                   help="what --save writes: torch_dist (Megatron's default), a sharded checkpoint through "
                        "torch.distributed.checkpoint that any layout resumes; torch, one file per (tp, pp, "
                        "ep) rank that only the same layout resumes. --load reads either")
    g.add_argument("--no-load-optim", action="store_true",
                   help="--load the weights only: fresh optimizer state and learning-rate schedule")
    g.add_argument("--no-load-rng", action="store_true", help="--load without the saved random states")
    g.add_argument("--ckpt-convert-format", default=None, choices=["torch", "torch_dist"],
                   help="load --load, save it in this format under --ckpt-convert-save DIR/<format>, and stop")
    g.add_argument("--ckpt-convert-save", default=None, metavar="DIR", help="where --ckpt-convert-format writes")


def _add_tokenizer_args(parser):
    g = parser.add_argument_group("tokenizer")
    g.add_argument("--tokenizer-type", default=None, choices=list(TOKENIZER_TYPES))
    g.add_argument("--vocab-file", default=None, help="GPT2BPETokenizer: vocab.json")
    g.add_argument("--merge-file", default=None, help="GPT2BPETokenizer: merges.txt")
    g.add_argument("--tokenizer-model", default=None, help="HuggingFaceTokenizer: tokenizer.json")
    g.add_argument("--vocab-size", type=POSITIVE, default=None, help="NullTokenizer: vocabulary size")


def _add_data_args(parser):
    g = parser.add_argument_group("data and dataloader")
    g.add_argument("--data-path", nargs="*", default=None,
                   help="PREFIX [PREFIX ...] or WEIGHT PREFIX [WEIGHT PREFIX ...] of .bin/.idx pairs")
    g.add_argument("--split", default=None,
                   help="train,valid,test proportions of every dataset, e.g. 969,30,1 (the default)")
    g.add_argument("--data-cache-path", default=None,
                   help="directory for the index .npy caches (default: beside each dataset)")
    g.add_argument("--mock-data", action="store_true", help="synthetic tokens instead of --data-path")
    g.add_argument("--seq-length", type=POSITIVE, default=None)
    g.add_argument("--num-workers", type=COUNT, default=0,
                   help="DataLoader worker processes per rank (Megatron: 2; 0 suits CPU ranks)")
    g.add_argument("--reset-position-ids", action="store_true",
                   help="restart position ids after each end-of-document token")
    g.add_argument("--reset-attention-mask", action="store_true",
                   help="no attention across end-of-document tokens")
    g.add_argument("--eod-mask-loss", action="store_true", help="no loss on predicting end-of-document")
    g.add_argument("--no-create-attention-mask-in-dataloader", dest="create_attention_mask_in_dataloader",
                   action="store_false", help="let the attention kernel build the causal mask")


ARGUMENT_GROUPS = (_add_network_size_args, _add_window_args, _add_mla_args, _add_regularization_args, _add_training_args,
                   _add_initialization_args, _add_learning_rate_args, _add_checkpointing_args,
                   _add_mixed_precision_args, _add_distributed_args, _add_validation_args,
                   _add_data_args, _add_tokenizer_args, _add_moe_args, _add_logging_args,
                   _add_fusion_args, _add_deepspeed_args, add_ci_args, add_policy_args, add_hybrid_args,
                   add_pipeline_split_args,
                   add_ckpt_args, add_launch_args, add_overlap_args, add_fsdp_args, add_torch_fsdp2_args)


def build_parser(extra_args_provider=None) -> argparse.ArgumentParser:
    parser = _Parser(prog="pretrain_gpt", description="minitron arguments (Megatron's names)",
                     allow_abbrev=False)
    for add in ARGUMENT_GROUPS:
        add(parser)
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    return parser
