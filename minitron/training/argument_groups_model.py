"""The argument groups of the model's optional architecture: where positions come from, the
attention variants (sliding windows, multi-latent attention) and mixture of experts.

Kept apart from argument_groups.py, which reads as the core vocabulary (sizes, training,
parallelism, data); these are the flags Megatron's newer models add, grouped as Megatron
groups them. Nothing here needs torch.
"""

from __future__ import annotations

from minitron.training.arguments_modelopt import add_modelopt_args
from minitron.training.arguments_ranges import CAPACITY, EXPERTS, POSITIVE, float_in, layer_pattern, window_size


def _add_window_args(parser):
    g = parser.add_argument_group("sliding-window attention")
    g.add_argument("--window-size", type=window_size, default=None,
                   help="LEFT,RIGHT: each query sees LEFT tokens back and RIGHT ahead (a GPT: L,0)")
    g.add_argument("--window-attn-skip-freq", type=layer_pattern, default=None,
                   help="N: every N-th layer attends to everything; or a 0/1 list per layer (1 = window)")
# Megatron 0.19's --position-embedding-type choices. minitron builds the first three; the
# others are taken by the parser so that validate_args can refuse them by name.
POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope", "none", "yarn", "mrope", "relative")


def _add_position_embedding_args(g):
    """Where a token's position enters the model (core/models/common/embeddings/)."""
    g.add_argument("--position-embedding-type", default="learned_absolute", choices=POSITION_EMBEDDING_TYPES,
                   help="learned_absolute: a table added to the input; rope: q and k rotated; none: no positions")
    # Megatron's two deprecated spellings, still taken there (and so here).
    g.add_argument("--no-position-embedding", dest="add_position_embedding", action="store_false",
                   help="deprecated in Megatron: refused unless the type is rope (use --position-embedding-type)")
    g.add_argument("--use-rotary-position-embeddings", action="store_true",
                   help="deprecated in Megatron: --position-embedding-type rope")
    g.add_argument("--rotary-percent", type=float_in(0.0, 1.0, above=True), default=1.0,
                   help="rope: the share of each head's channels that rotate")
    g.add_argument("--rotary-base", type=POSITIVE, default=10000, help="rope: the base of the angles")
    g.add_argument("--rotary-interleaved", action="store_true",
                   help="rope: rotate channel pairs (2i, 2i+1) instead of (i, i + d/2)")
    g.add_argument("--rotary-seq-len-interpolation-factor", type=POSITIVE, default=None, metavar="F",
                   help="rope: positions divided by F (position interpolation)")
    g.add_argument("--use-rope-scaling", action="store_true",
                   help="rope: Llama 3.1's scaling of the slow angles")
    g.add_argument("--rope-scaling-factor", type=float_in(0.0, above=True), default=8.0,
                   help="rope: how much --use-rope-scaling slows the slow angles")
    # YaRN (--position-embedding-type yarn); None: YarnRotaryEmbedding's default. MLA's YaRN
    # reads MLATransformerConfig's own values instead, so validate_args refuses these with it.
    g.add_argument("--yarn-original-max-position-embeddings", type=POSITIVE, default=None,
                   help="yarn: the context the model was trained on (default 4096)")
    g.add_argument("--yarn-beta-fast", type=float_in(0.0, above=True), default=None,
                   help="yarn: channels turning more often than this over that context keep their angles (32)")
    g.add_argument("--yarn-beta-slow", type=float_in(0.0, above=True), default=None,
                   help="yarn: channels turning less often than this are slowed by the factor (1)")
    g.add_argument("--yarn-correction-range-round-to-int", action="store_true", default=None,
                   help="yarn: round the blended channel range outwards to whole channels (the default)")
    g.add_argument("--no-yarn-correction-range-round-to-int", action="store_false", default=None,
                   dest="yarn_correction_range_round_to_int", help="yarn: keep the range's fractional ends")


def _add_layer_variant_args(g):
    """Newer GPTs' changes inside the layer (attention.py, mlp.py, core/activations.py),
    validated by arguments_layer.py."""
    g.add_argument("--add-qkv-bias", action="store_true",
                   help="a bias on linear_qkv even with --disable-bias-linear (Qwen 2.5)")
    g.add_argument("--squared-relu", action="store_true", help="MLP activation relu(x)^2 (Nemotron)")
    g.add_argument("--quick-geglu", action="store_true",
                   help="gated MLP, quick_gelu(x W_gate) * (x W_up), quick_gelu(x) = x sigmoid(1.702 x) (gpt-oss)")
    g.add_argument("--glu-linear-offset", type=float_in(float("-inf")), default=0.0,
                   help="gated MLP: act(gate) * (up + offset) (gpt-oss: 1.0)")
    g.add_argument("--activation-func-clamp-value", type=float_in(0.0, above=True), default=None, metavar="V",
                   help="gated MLP: gate clamped to <= V and up to [-V, V] before the product (gpt-oss: 7.0)")
    g.add_argument("--softmax-type", default="vanilla", choices=["vanilla", "off-by-one", "learnable"],
                   help="attention sinks: one more logit per head in each softmax, 0 (off-by-one) or learned "
                        "(gpt-oss), that takes a share of the attention and is dropped")
    g.add_argument("--qk-l2-norm", action="store_true",
                   help="scale each head's query and key to unit RMS, no weight (Llama 4); instead of --qk-layernorm")
    g.add_argument("--no-rope-freq", type=layer_pattern, default=None,
                   help="layers without rope (Llama 4's NoPE): every N-th layer, or a 0/1 list per layer (1 = no rope)")
    add_modelopt_args(g)   # ModelOpt's aliases: --export-qk-l2-norm, --export-moe-apply-..., --enable-gpt-oss


def _add_mla_args(parser):
    """Multi-latent attention (core/transformer/multi_latent_attention.py), Megatron's defaults."""
    g = parser.add_argument_group("multi-latent attention")
    g.add_argument("--multi-latent-attention", action="store_true",
                   help="DeepSeek-V2's attention: keys and values rebuilt from one small latent per token")
    g.add_argument("--q-lora-rank", type=POSITIVE, default=None, help="queries through a latent of this size too")
    g.add_argument("--kv-lora-rank", type=POSITIVE, default=32, help="the key/value latent's size")
    g.add_argument("--qk-head-dim", type=POSITIVE, default=128, help="a head's query/key channels without rope")
    g.add_argument("--qk-pos-emb-head-dim", type=POSITIVE, default=64, help="a head's rope channels")
    g.add_argument("--v-head-dim", type=POSITIVE, default=128)
    # Megatron lists it with its training flags; None lets MLA take its own default, YaRN.
    g.add_argument("--rope-type", default=None, choices=["rope", "yarn"],
                   help="MLA's rope (default yarn; other attention has rope only)")
    # YaRN's stretch, read by MLA's yarn and by --position-embedding-type yarn (Megatron's defaults).
    g.add_argument("--rotary-scaling-factor", type=float_in(0.0, above=True), default=1.0,
                   help="yarn: the context is stretched this many times (1: not at all)")
    g.add_argument("--mscale", type=float_in(0.0), default=1.0, help="yarn: the attention temperature's numerator weight")
    g.add_argument("--mscale-all-dim", type=float_in(0.0), default=0.0,
                   help="yarn: its denominator weight (MLA folds it into the softmax scale)")


def _add_moe_args(parser):
    g = parser.add_argument_group("moe")
    g.add_argument("--num-experts", type=EXPERTS, default=None,
                   help="experts per MoE layer; --expert-model-parallel-size spreads them")
    # No defaults here (None: not given): validate_moe refuses these for a dense model, then
    # fills in MOE_DEFAULTS, Megatron's.
    g.add_argument("--moe-router-topk", type=POSITIVE, default=None, help="experts each token is sent to (default 2)")
    g.add_argument("--moe-aux-loss-coeff", type=float_in(0.0), default=None,
                   help="weight of the load-balancing loss (Megatron suggests 1e-2; default 0: none)")
    g.add_argument("--moe-layer-freq", type=layer_pattern, default=None,
                   help="every N-th layer is an MoE layer (the first one always; default 1), or a 0/1 list "
                        "per layer such as ([0]+[1]*26)")
    g.add_argument("--moe-ffn-hidden-size", type=POSITIVE, default=None, help="an expert's ffn size; "
                   "default: --ffn-hidden-size")
    g.add_argument("--moe-expert-capacity-factor", type=CAPACITY, default=None, metavar="F",
                   help="an expert takes at most ceil(F x tokens x topk / experts) of a rank's tokens per "
                        "micro-batch; the rest are dropped (lowest probabilities first). Default: dropless")
    g.add_argument("--moe-pad-expert-input-to-capacity", action="store_true",
                   help="fill every expert's input up to its capacity, so each all-to-all has a fixed size")
    g.add_argument("--moe-token-drop-policy", default="probs", choices=["probs", "position"],
                   help="beyond capacity, drop the least probable tokens (probs) or the last ones (position)")
    # Routing (moe/router.py, moe_utils.topk_routing_with_score_function); Megatron's defaults.
    g.add_argument("--moe-router-load-balancing-type", default="aux_loss",
                   choices=["aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"],
                   help="the balance loss weighted by --moe-aux-loss-coeff: per micro-batch, per sequence, "
                        "per global batch; or sinkhorn (S-BASE: a balanced choice, no loss); or none")
    g.add_argument("--moe-router-num-groups", type=POSITIVE, default=None,
                   help="group-limited routing (DeepSeek-V3): cut the experts into this many groups, e.g. one "
                        "per expert-parallel rank or node; with --moe-router-group-topk")
    g.add_argument("--moe-router-group-topk", type=POSITIVE, default=None,
                   help="each token chooses its top-k experts inside its best this-many groups")
    g.add_argument("--moe-router-force-load-balancing", action="store_true",
                   help="benchmarking only: random router logits, so every expert gets its even share")
    g.add_argument("--moe-apply-probs-on-input", action="store_true",
                   help="scale each expert's input by the routing weight, not its output (Llama 4; top-1 only)")
    # Multi-token prediction (DeepSeek-V3; core/transformer/multi_token_prediction.py)
    g = parser.add_argument_group("multi-token prediction")
    g.add_argument("--mtp-num-layers", type=POSITIVE, default=None,
                   help="D extra layers on the last stage, depth k predicting the token k+1 ahead (default: none)")
    g.add_argument("--mtp-loss-scaling-factor", type=float_in(0.0), default=0.1,
                   help="weight of the MTP losses, shared evenly by the D depths (Megatron's default 0.1)")
    g.add_argument("--moe-router-score-function", default="softmax", choices=["softmax", "sigmoid"],
                   help="how logits become scores: softmax over experts, or one sigmoid each")
    g.add_argument("--moe-router-pre-softmax", action="store_true",
                   help="softmax over all experts before the top-k (default: over the chosen k after)")
    g.add_argument("--moe-router-topk-scaling-factor", type=float_in(0.0, above=True), default=None,
                   help="multiply the chosen experts' weights by this (default: no scaling)")
    g.add_argument("--moe-router-dtype", default=None, choices=["fp32", "fp64"],
                   help="run the router's matmul and scores in this precision (default: the model's)")
    g.add_argument("--moe-z-loss-coeff", type=float_in(0.0), default=None,
                   help="weight of the router z-loss, mean logsumexp(logits)^2 (Megatron suggests 1e-3)")
    g.add_argument("--moe-router-enable-expert-bias", action="store_true",
                   help="aux-loss-free balancing: a per-expert bias on the choice, moved after each step")
    g.add_argument("--moe-router-bias-update-rate", type=float_in(0.0), default=1e-3,
                   help="the expert bias's step per global batch (default 1e-3, DeepSeek-V3's)")
    g.add_argument("--moe-token-dispatcher-type", default="allgather", choices=["allgather", "alltoall", "flex"],
                   help="how tokens reach their experts: all-gather the group's tokens (Megatron's default) "
                        "or send each rank only its experts' rows (all-to-all); flex is Megatron's all-to-all "
                        "through DeepEP/HybridEP kernels, run here as alltoall (argument_groups_launch.py)")
    g.add_argument("--moe-grouped-gemm", action="store_true",
                   help="run the local experts as one batched matmul instead of one after another")
    g.add_argument("--moe-shared-expert-intermediate-size", type=POSITIVE, default=None,
                   help="width of an MLP every token goes through beside the routed experts "
                        "(n shared experts of width f: n x f)")
    g.add_argument("--moe-latent-size", type=POSITIVE, default=None,
                   help="latent MoE (Nemotron-3 Super/Ultra): project each token h -> L before the dispatch "
                        "and L -> h after the combine; the routed experts work in L (moe/latent_projection.py)")


def _add_fusion_args(parser):
    """Megatron's kernel fusions (core/fusions/), compiled by torch.compile: opt-in here.

    Megatron's command line turns the bias-GeLU, bias-SwiGLU and bias-dropout fusions on by default
    and its --no-bias-gelu-fusion etc. turn them off; minitron's default is the readable unfused
    ops, so those are accepted and change nothing (arguments_policy.py), and these spellings,
    minitron's own for Megatron's dests, turn the fusions on.
    """
    g = parser.add_argument_group("fusions (opt-in: one compiled kernel where the default runs several ops)")
    g.add_argument("--bias-gelu-fusion", action="store_true",
                   help="fc1's bias + GeLU in one kernel (minitron's spelling of Megatron's dest "
                        "bias_gelu_fusion, on by default there); without --swiglu")
    g.add_argument("--bias-swiglu-fusion", action="store_true",
                   help="fc1's bias + SwiGLU in one kernel (Megatron's dest bias_swiglu_fusion); with --swiglu")
    g.add_argument("--bias-dropout-fusion", action="store_true",
                   help="bias + dropout + residual add in one kernel (Megatron's dest bias_dropout_fusion)")
    g.add_argument("--cross-entropy-loss-fusion", action="store_true",
                   help="the vocab-parallel cross entropy from compiled pieces, one all-reduce fewer "
                        "(Megatron's flag, off by default there too)")
