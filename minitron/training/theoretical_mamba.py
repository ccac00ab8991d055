"""The accountant's hybrid model: a Mamba layer's widths, parameters and activations, and the
layers of a hybrid pattern's model chunk.

theoretical_params / _activations / _flops use these when ``--hybrid-layer-pattern`` is set;
the pattern's layer list, total and FLOP count sit there, beside the GPT's, so that this module
imports none of them. Everything else (embedding, output layer, optimizer, pipeline schedule)
is the GPT's arithmetic unchanged. Torch-free, like the rest of the accountant.

Per Mamba layer, on a tensor-parallel rank (d = d_inner = heads x head_dim, G groups, N state):

* parameters: in_proj h x (2d + 2GN + H) and out_proj d x h, both cut by t; the conv
  (2GN + d channels x d_conv, and a bias), dt_bias, A_log, D (per head) and the gated norm's
  weight (per channel), all cut by t with the heads and groups; the layer's own norm, whole.
* FLOPs (counted in theoretical_flops.py), Megatron's count (training.py, mamba_layer_flops):
  the two GEMMs, plus 7·d·N per token for the scan, "a small percent of the layer" by
  Megatron's own note. minitron takes d from the heads (H x head_dim), which Megatron's count
  fixes at 2h; they differ only when --mamba-num-heads says otherwise.
"""

from __future__ import annotations

from types import SimpleNamespace

from minitron.core.ssm.mamba_hybrid_layer_allocation import Symbols, layer_symbols, select_pipeline_segment
from minitron.training.theoretical_param_type import Param, _flag

D_CONV = 4   # the mixer's d_conv (Megatron's default; no flag sets it)


def mamba_dims(args) -> SimpleNamespace:
    """The Mamba layer's widths: heads, inner width, groups, state."""
    heads = args.mamba_num_heads or 2 * args.hidden_size // args.mamba_head_dim
    inner = heads * args.mamba_head_dim
    gn = args.mamba_num_groups * args.mamba_state_dim
    return SimpleNamespace(heads=heads, inner=inner, gn=gn, in_proj=2 * inner + 2 * gn + heads, conv=inner + 2 * gn)


def mamba_layer_params(args, p: str) -> list[Param]:
    """A Mamba layer's parameters on a TP rank, in the order the module registers them."""
    t, h = args.tensor_model_parallel_size, args.hidden_size
    m = mamba_dims(args)
    sp = bool(args.sequence_parallel) and t > 1
    out = [Param(p + "mixer.conv1d_weight", m.conv // t * D_CONV, row=D_CONV), Param(p + "mixer.conv1d_bias", m.conv // t),
           Param(p + "mixer.dt_bias", m.heads // t), Param(p + "mixer.A_log", m.heads // t),
           Param(p + "mixer.D", m.heads // t), Param(p + "mixer.in_proj.weight", m.in_proj // t * h, row=h),
           Param(p + "mixer.norm.weight", m.inner // t),
           Param(p + "mixer.out_proj.weight", h * m.inner // t, row=m.inner // t)]
    out += [Param(p + "norm.weight", h, sequence_parallel=sp)]
    if _flag(args, "normalization", "LayerNorm") != "RMSNorm":
        out += [Param(p + "norm.bias", h, sequence_parallel=sp)]
    return out


def hybrid_chunk_layers(args, pp_rank: int, chunk: int) -> range:
    """The layers (0-based) of a model chunk: the pattern's segment, as HybridStack builds it."""
    segment, offset = select_pipeline_segment(args.hybrid_layer_pattern, pp_rank,
                                              args.pipeline_model_parallel_size,
                                              chunk if args.virtual_pipeline_model_parallel_size else None)
    return range(offset, offset + len(segment))


CHUNK_SIZE = 128   # the mixer's chunk_size (Megatron's default; no flag sets it)


def ssd_saved_bytes(b: int, s: int, heads: int, headdim: int, state: int, chunk: int) -> int:
    """Bytes the chunked scan (core/ssm/ssd.py) keeps for backward, storage by storage, in fp32:
    per head and token (padded length S) three Q-wide tensors (the decay mask, the C.B scores
    and their product), B and C as each head reads them and the einsums' copies of them (five
    N-wide), x.dt and its decayed forms (three P-wide), two decays; per chunk the states each
    chunk leaves and the states passed on (P x N); the two causal masks (bool); x and dt padded
    to whole chunks, if they were. With a single chunk torch's einsum takes another contraction
    order, which keeps fewer copies.
    (Counted against a run's saved-tensor hooks in tests/test_hybrid_estimate.py.)"""
    chunk = min(chunk, s)   # ssd_chunked never pads a short sequence up to a whole chunk
    c = -(-s // chunk)
    S = c * chunk
    if c == 1:
        per_head = 3 * S * chunk + 3 * S * state + 2 * S * headdim + 2 * S + 4 + 4 * headdim * state
    else:
        per_head = (3 * S * chunk + 5 * S * state + 3 * S * headdim + 2 * S + (c + 1) ** 2
                    + (2 * c + 1) * headdim * state)
    if S != s:   # padded up to whole chunks: x and dt are new, padded tensors then
        per_head += S * headdim + S
    return 4 * b * heads * per_head + 2 * chunk ** 2 + 2 * (c + 1) ** 2


def mamba_layer_bytes(args, norm: int, drop: int, local: int, s: int, b: int, e: int) -> int:
    """Bytes a Mamba layer keeps for backward (one micro-batch), storage by storage: its norm
    and in_proj's input (this rank's rows with sequence parallelism); in_proj's output, which the
    conv's input and z stay views of; the conv's output (d_conv - 1 steps longer: the causal
    padding) and the SiLU's, which x, B and C are views of; softplus's input and output for dt and
    -exp(A_log) (fp32); the scan; the gated norm in fp32 (y, silu(z), y.silu(z), its normalised
    form and the weighted output, out_proj's input, with 1/rms per group); the dropout. In half
    precision the fp32 copies of z and out_proj's half input are new storages too."""
    t, m = args.tensor_model_parallel_size, mamba_dims(args)
    heads, groups, conv, inner = m.heads // t, args.mamba_num_groups // t, m.conv // t, m.inner // t
    kept = norm + local * b * args.hidden_size * e + s * b * m.in_proj // t * e
    kept += (2 * s + D_CONV - 1) * b * conv * e + 2 * s * b * heads * 4 + 2 * heads * 4
    kept += ssd_saved_bytes(b, s, heads, args.mamba_head_dim, args.mamba_state_dim, CHUNK_SIZE)
    kept += 5 * s * b * inner * 4 + s * b * groups * 4
    if e != 4:
        kept += s * b * inner * (4 + e)
    return kept + drop


def hybrid_layer_activations(args, layers, layer: int, norm: int, drop: int, local: int, s: int, b: int,
                             e: int) -> list[int]:
    """Each layer's bytes: a Mamba layer's, or the attention or MLP half of the GPT layer that
    theoretical_activations worked out (``layer``: both halves; the MLP half is taken from it).
    An E layer counts as an MLP half here; theoretical_moe's delta turns it into experts."""
    t, h = args.tensor_model_parallel_size, args.hidden_size
    ffn = args.ffn_hidden_size // t
    mlp_half = norm + local * b * h * e + (4 if _flag(args, "swiglu", False) else 2) * s * b * ffn * e + drop
    symbols = layer_symbols(args.hybrid_layer_pattern)
    each = {Symbols.MAMBA: mamba_layer_bytes(args, norm, drop, local, s, b, e),
            Symbols.ATTENTION: layer - mlp_half, Symbols.MLP: mlp_half, Symbols.MOE: mlp_half}
    return [each[symbols[i]] for i in layers]
