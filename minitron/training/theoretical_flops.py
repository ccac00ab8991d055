"""Compute for one iteration: Megatron's ``num_floating_point_operations`` and what it feeds.

Megatron prints ``throughput per GPU (TFLOP/s/GPU)`` when run with ``--log-throughput``. That
number is not measured: it is a closed-form count of the *model's* floating-point operations
for one global batch (megatron/training/training.py, ``num_floating_point_operations``) divided
by the measured iteration time and the world size. This module is that count, term by term and
under the same name, so ``minitron estimate`` can print it beside the memory, before anything
runs. It imports nothing heavy: estimate must answer in a fraction of an ``import torch``.

The count is a *model* FLOP count, the numerator of MFU (model FLOPs utilisation). Four
conventions, all Megatron's, and each one visible below:

* Only matrix multiplications count, at 2 operations per multiply-add (``FMA``). Norms,
  softmax, activations, dropout, rotary embeddings and the optimizer are left out: they are
  memory-bound and small beside the GEMMs.
* The backward pass costs twice the forward (one GEMM for the input's gradient, one for the
  weight's), so every GEMM counts 3 times (``FWD_BWD``). Recomputation is *not* counted: it
  is work the hardware does that the model does not need, which is why MFU ignores it while
  "hardware FLOPs utilisation" would not.
* Core attention (``QK^T`` and ``softmax · V``) is counted for half of the s × s scores,
  because the causal mask makes half of them zero: a kernel that skips them (flash attention)
  does half the work. Plain ``torch.matmul`` of the full matrix does twice that.
* The MoE router's h × E GEMM and the embedding lookup (a gather, no GEMM) are not counted.

tests/test_estimate_flops.py counts every matmul of a real forward and backward with torch's
FLOP counter and finds exactly these differences, no others.
"""

from __future__ import annotations

from minitron.core import layer_patterns
from minitron.core.ssm.mamba_hybrid_layer_allocation import Symbols, layer_symbols
from minitron.training.theoretical_mamba import mamba_dims
from minitron.training.theoretical_param_type import _flag

FMA = 2        # a multiply-add is two floating-point operations
FWD_BWD = 3    # forward, plus backward's input-gradient and weight-gradient GEMMs


def moe_layer_pattern(args) -> list[int]:
    """1 for each layer whose MLP is an MoE layer, 0 for a dense one (Megatron's
    ``--moe-layer-freq``: an int k means every k-th layer from layer 0; a list gives each)."""
    if getattr(args, "num_experts", None) is None:
        return [0] * args.num_layers
    return layer_patterns.moe_layer_pattern(getattr(args, "moe_layer_freq", 1), args.num_layers)


def _attention_per_token(args) -> tuple[float, float]:
    """(projection FLOPs per token, core-attention FLOPs per token per token of sequence) for
    one layer, forward and backward."""
    heads, h = args.num_attention_heads, args.hidden_size
    if getattr(args, "multi_latent_attention", False):
        # DeepSeek's MLA: queries through a low-rank "lora" (or straight from h when
        # q_lora_rank is None), keys and values from one compressed latent of kv_lora_rank,
        # plus a small shared rope key; the +1 terms are Megatron's count of the latent norms.
        qk = args.qk_head_dim + args.qk_pos_emb_head_dim
        if args.q_lora_rank is None:
            q = h * heads * qk
        else:
            q = args.q_lora_rank * (h + heads * qk + 1)
        kv = args.kv_lora_rank * (h + heads * (args.qk_head_dim + args.v_head_dim) + 1)
        projections = q + kv + h * args.qk_pos_emb_head_dim + heads * args.v_head_dim * h
        core = heads * qk / 2 + heads * args.v_head_dim / 2
    else:
        groups = args.num_query_groups if getattr(args, "group_query_attention", False) else heads
        query = args.kv_channels * heads
        key_value = 2 * args.kv_channels * groups
        projections = h * (query + key_value) + query * h        # QKV in, and the output projection
        core = query / 2 * 2   # QK^T and scores·V, each over half the scores (the causal mask)
    return FWD_BWD * FMA * projections, FWD_BWD * FMA * core


def mamba_flops_per_token(args) -> float:
    """Forward and backward FLOPs of one Mamba layer per token (Megatron's count, x3)."""
    m, h = mamba_dims(args), args.hidden_size
    return FWD_BWD * (FMA * h * m.in_proj + 7 * m.inner * args.mamba_state_dim + FMA * m.inner * h)


def hybrid_num_floating_point_operations(args, batch_size: int) -> float:
    """Megatron's hybrid_flops: each kind of layer counted by the pattern, each at the cost the
    GPT count gives its half of a transformer layer (attention, dense MLP, MoE), plus Mamba's."""
    symbols = layer_symbols(args.hybrid_layer_pattern)
    count = {s: symbols.count(s) for s in Symbols.BUILT}
    tokens, h = batch_size * args.seq_length, args.hidden_size
    gated = 3 if args.swiglu or _flag(args, "quick_geglu", False) else 2
    projections, core = _attention_per_token(args)
    mlp = FWD_BWD * FMA * h * args.ffn_hidden_size * gated
    moe = 0.0
    if count[Symbols.MOE]:
        ffn = args.moe_ffn_hidden_size or args.ffn_hidden_size
        shared = _flag(args, "moe_shared_expert_intermediate_size", None) or 0
        latent = _flag(args, "moe_latent_size", None)   # routed experts L wide, and h x L down and up
        routed = (latent * ffn * args.moe_router_topk * gated + 2 * h * latent if latent
                  else h * ffn * args.moe_router_topk * gated)
        moe = FWD_BWD * FMA * (routed + h * shared * gated)
    logits = FWD_BWD * FMA * h * args.padded_vocab_size
    per_token = (projections * count[Symbols.ATTENTION] + mlp * count[Symbols.MLP] + moe * count[Symbols.MOE]
                 + mamba_flops_per_token(args) * count[Symbols.MAMBA] + logits)
    return tokens * per_token + batch_size * args.seq_length ** 2 * core * count[Symbols.ATTENTION]


def num_floating_point_operations(args, batch_size: int) -> float:
    """Model FLOPs of one iteration over ``batch_size`` sequences of ``args.seq_length``
    tokens, as Megatron counts them (see the module's docstring for what is left out)."""
    if getattr(args, "hybrid_layer_pattern", None):   # Megatron's hybrid_flops: counted by the pattern
        return hybrid_num_floating_point_operations(args, batch_size)
    tokens = batch_size * args.seq_length
    pattern = moe_layer_pattern(args)
    # Multi-token prediction's layers are built like the decoder's last (Megatron counts them so)
    mtp = getattr(args, "mtp_num_layers", None) or 0
    layers = args.num_layers + mtp
    moe_layers = sum(pattern) + mtp * pattern[-1]
    dense_layers = layers - moe_layers
    gated = 3 if args.swiglu or getattr(args, "quick_geglu", False) else 2   # GEMMs in an MLP: (gate and) up, then down
    routed = shared = 0
    if moe_layers:
        ffn = args.moe_ffn_hidden_size or args.ffn_hidden_size
        routed = ffn * args.moe_router_topk * gated   # each token runs through topk experts
        latent = getattr(args, "moe_latent_size", None)
        if latent:   # ... L wide, and is projected h -> L -> h once (per h: Megatron's form)
            routed = routed * latent / args.hidden_size + 2 * latent
        shared = (getattr(args, "moe_shared_expert_intermediate_size", None) or 0) * gated
    mlp = FWD_BWD * FMA * args.hidden_size * (args.ffn_hidden_size * gated * dense_layers
                                              + (routed + shared) * moe_layers)
    projections, core = _attention_per_token(args)
    logits = FWD_BWD * FMA * args.hidden_size * args.padded_vocab_size * (1 + mtp)   # every head's
    mtp_glue = FWD_BWD * FMA * mtp * (3 * args.hidden_size + 2 * args.hidden_size ** 2)   # norms, eh_proj
    per_token = mlp + projections * layers + logits + mtp_glue
    # Core attention grows with the square of the sequence: s² per sequence, not s per token.
    return tokens * per_token + batch_size * args.seq_length ** 2 * core * layers


def throughput_per_gpu(flops: float, iteration_seconds: float, world_size: int) -> float:
    """TFLOP/s per GPU, the number Megatron's ``--log-throughput`` prints: the model's FLOPs
    over the iteration's time, shared evenly by every rank of the world."""
    return flops / (iteration_seconds * 10**12 * world_size)


# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity), for MFU. Source: NVIDIA's data sheets
# (H100: "NVIDIA H100 Tensor Core GPU" datasheet; H200: "NVIDIA H200 Tensor Core GPU"; A100:
# "NVIDIA A100 Tensor Core GPU"), whose bf16 figures are quoted with sparsity: halved here.
# H100 and H200 SXM share the same compute (the H200 has more and faster memory); the PCIe and
# NVL cards run at lower clocks. The names are what `minitron estimate --peak-tflops` takes.
PEAK_TFLOPS = {"h100": 989.0, "h200": 989.0, "a100": 312.0}
# Fragments of the name the driver reports (torch.cuda.get_device_name, lower case), the more
# particular first: "NVIDIA H100 PCIe" is not an SXM part, "NVIDIA H100 80GB HBM3" is.
_DEVICE_PEAKS = (("h100 pcie", 756.0), ("h100 nvl", 835.0), ("h200 nvl", 835.0),
                 *PEAK_TFLOPS.items())


def peak_tflops_of(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named as its driver names it, or None when the table does
    not know it (a CPU, any other card): then there is no MFU to state."""
    name = device_name.lower()
    return next((peak for fragment, peak in _DEVICE_PEAKS if fragment in name), None)


def model_flops_utilization(tflops_per_gpu: float, peak_tflops: float) -> float:
    """MFU: the model's FLOP rate per GPU as a fraction of the device's peak."""
    return tflops_per_gpu / peak_tflops
