"""What --fp8-format changes in a rank's bytes (the accountant's fp8 terms).

With fp8 the linears inside the transformer layers (core/fp8/linear.py) keep for backward not
their input in the training dtype but its fp8 copy, one byte per element, and beside it the fp8
copy of their weight, made afresh in each micro-batch's forward, and two 1/scale factors of 4
bytes. So each micro-batch in flight holds, per quantized linear:

    - (e - 1) x input elements     the input, once in e bytes, now in 1
    + weight elements               the fp8 weight
    + 8                             the two 1/scale factors

where the unquantized input was kept by that linear alone (true of every input but one: the
two down projections of multi-latent attention read the same normalised hidden states, so
there the e-byte tensor is freed and two fp8 copies are kept). The output layer and the
embedding are not quantized (nor are they in Megatron with Transformer Engine). The routed
experts are (moe/experts.py): each local expert's fc1 and fc2 keep their rows, padded with zero
rows to a multiple of 16 (mxfp8: 32), in fp8, and the activation between them keeps its
padding rows in e bytes. How many rows arrive is the dispatcher's count
(theoretical_moe.expert_rows): exact when padded to capacity, else the balanced expectation.

Persistent besides: each quantized linear has three tensor slots (input, weight, output
gradient); under the delayed recipe each keeps an amax history of --fp8-amax-history-len fp32
values and an fp32 scale, under tensorwise its last scale. (Transformer Engine keeps a few more
fp32 words per slot: scale_inv and its amax buffers.)

Held to saved-tensor hooks (tests/test_fp8_estimate.py): exact for tp, sequence parallelism,
SwiGLU, GQA, and multi-latent attention with --qk-layernorm. Without --qk-layernorm MLA's up
projections read views of the down projections' outputs, parts of which other operations keep,
so less is freed than counted here (6% of the delta on the test's model): not exact.

Communication (fp8_comm, on top of theoretical_comm.py's unquantized count): under sequence
parallelism the column-parallel inputs are all-gathered in fp8, one byte per element instead of
e, in forward and again in backward; under the delayed recipe every cast all-reduces its
4-byte amax over the amax reduction group ("tp-dp-cp"); under tensorwise only a
sequence-parallel input's amax is, over the tensor-parallel group.

Without --fp8-param-gather fp8 changes no parameter, gradient or optimizer byte: the weights
stay in the training dtype. With it (core/fp8/param_gather.py) the quantized linears' weights
are fp8 parameters, one byte each, in a DDP buffer of their own (DDP buffers by dtype), which
the distributed optimizer all-gathers in one byte an element (``split_fp8_params`` lays the
buffers out, ``fp8_param_bytes`` and ``fp8_comm`` count them). The forward then casts no
weight: the weight slots record no amax per micro-batch; instead the optimizer's casts reduce
all of a stage's weight amaxes in one packed all-reduce a step, over the amax reduction group
(delayed) or, before the cast, over the data-parallel group (tensorwise).
"""

from __future__ import annotations

from minitron.training.theoretical_moe import expert_rows
from minitron.training.theoretical_params import (
    DTYPE_BYTES, _flag, chunk_layers, chunks_of, is_moe_layer, model_params, num_microbatches,
)

# the linears core/fp8 quantizes: every Column/RowParallelLinear inside a transformer layer
_LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "linear_q_proj", "linear_q_down_proj",
            "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj")


def _is_quantized_weight(p) -> bool:
    return ".layers." in p.name and p.name.endswith(".weight") and p.name.split(".")[-2] in _LINEARS


def _quantized_weights(args, pp_rank: int, chunk: int) -> list[int]:
    """Elements of each quantized linear's weight on this rank, layer by layer."""
    return [p.numel for p in model_params(args, pp_rank, chunk) if _is_quantized_weight(p)]


def split_fp8_params(args, buffers: list, layout) -> list:
    """--fp8-param-gather: the quantized weights leave a chunk's dense buffer (split_buffers'
    first entry) for an fp8 buffer of their own, laid out by the same rules."""
    if not (_flag(args, "fp8") and _flag(args, "fp8_param_gather")):
        return buffers
    (dense, _), dp = buffers[0], args.data_parallel_size * args.context_parallel_size
    fp8 = [p for p in dense if _is_quantized_weight(p)]
    rest = [p for p in dense if not _is_quantized_weight(p)]
    return [(rest, layout(rest, dp)), (fp8, layout(fp8, dp))] + buffers[1:]


def fp8_param_bytes(args, stage: list) -> int:
    """What the fp8 buffers save in parameter bytes: e - 1 bytes an element (padding included,
    as DDP allocates it)."""
    if not (_flag(args, "fp8") and _flag(args, "fp8_param_gather")):
        return 0
    e = DTYPE_BYTES[args.params_dtype]
    return sum(layout[0][-1][1] for plist, layout in stage if _fp8_buffer(plist)) * (e - 1)


def _fp8_buffer(plist) -> bool:
    return bool(plist) and all(_is_quantized_weight(p) for p in plist)


def _saved_inputs(args, local: int, s: int, b: int, moe: bool = False) -> list[tuple[int, int]]:
    """Per layer, each quantized linear's input: (elements of its fp8 copy, elements of the
    training-dtype tensor that is no longer kept for it). ``moe``: a layer whose MLP is experts."""
    t, h = args.tensor_model_parallel_size, args.hidden_size
    fc = _moe_inputs(args, local, s, b) if moe else [(local * b * h, local * b * h),
                                                     (s * b * args.ffn_hidden_size // t,) * 2]   # fc1, fc2
    if not _flag(args, "multi_latent_attention", False):
        proj = s * b * args.kv_channels * args.num_attention_heads // t
        return [(local * b * h, local * b * h), (proj, proj)] + fc                     # qkv, proj
    proj = s * b * args.v_head_dim * args.num_attention_heads // t
    ranks = [args.kv_lora_rank] + ([args.q_lora_rank] if args.q_lora_rank is not None else [])
    # the two down projections read one tensor: two fp8 copies, one tensor freed
    return [(2 * local * b * h, local * b * h), (proj, proj)] + [(local * b * r,) * 2 for r in ranks] + fc


def _moe_inputs(args, local: int, s: int, b: int) -> list[tuple[int, int]]:
    """An MoE layer's quantized inputs. The shared expert's fc1 reads the normalised tokens that
    the router keeps too (unless --moe-router-dtype casts the router's own copy), so its fp8
    copy frees nothing. Each local expert's fc1 and fc2 keep their padded rows in fp8 and free
    the rows that arrived (moe/experts.py)."""
    h, t, etp = args.hidden_size, args.tensor_model_parallel_size, args.expert_tensor_parallel_size
    out = []
    shared = _flag(args, "moe_shared_expert_intermediate_size")
    if shared:
        out += [(local * b * h, local * b * h if _flag(args, "moe_router_dtype") else 0), (s * b * shared // t,) * 2]
    arrived, padded, local_experts = expert_rows(args)
    ffn = args.moe_ffn_hidden_size // etp
    return out + [(local_experts * padded * h, local_experts * arrived * h),
                  (local_experts * padded * ffn, local_experts * arrived * ffn)]


def _expert_padding(args) -> float:
    """Bytes an MoE layer's experts keep in the training dtype for their padding rows: the
    activation's saved input (gated: fc1's [gate | up] and silu(gate), 3 ffn wide)."""
    arrived, padded, local_experts = expert_rows(args)
    width = (3 if _flag(args, "swiglu", False) else 1) * args.moe_ffn_hidden_size // args.expert_tensor_parallel_size
    return local_experts * (padded - arrived) * width * DTYPE_BYTES[args.params_dtype]


def fp8_activation_delta(args, pp_rank: int, chunk: int) -> int:
    """Bytes one micro-batch's forward through one chunk keeps for backward with fp8, minus
    what it keeps without (theoretical_activations.py's count)."""
    if not _flag(args, "fp8"):
        return 0
    e = DTYPE_BYTES[args.params_dtype]
    t, b = args.tensor_model_parallel_size, args.micro_batch_size
    s = args.seq_length // args.context_parallel_size
    local = s // t if (args.sequence_parallel and t > 1) else s   # a column-parallel input's rows
    weights = _quantized_weights(args, pp_rank, chunk)
    layers = chunk_layers(args, pp_rank, chunk)
    moe = sum(1 for layer in layers if is_moe_layer(args, layer))
    inputs = ((len(layers) - moe) * _saved_inputs(args, local, s, b)
              + moe * (_saved_inputs(args, local, s, b, moe=True) if moe else []))
    kept, freed = sum(n for n, _ in inputs), sum(f for _, f in inputs)
    delta = kept - e * freed + sum(weights)                       # one byte each, e bytes gone
    delta += moe * _expert_padding(args) if moe else 0
    if args.fp8_recipe == "mxfp8":   # an e8m0 exponent per 32 elements instead of two 1/scales
        return round(delta + kept // 32 + sum(w // 32 for w in weights))
    return round(delta + 8 * len(weights))


def fp8_state_bytes(args, pp_rank: int) -> int:
    """The scales and amax histories a pipeline stage keeps between steps (all its chunks)."""
    if not _flag(args, "fp8"):
        return 0
    linears = sum(len(_quantized_weights(args, pp_rank, chunk)) for chunk in chunks_of(args))
    if args.fp8_recipe == "mxfp8":   # no tensor-wide scales: nothing kept between steps
        return 0
    history = args.fp8_amax_history_len if args.fp8_recipe == "delayed" else 0
    return linears * 3 * 4 * (history + 1)


def _gathered_widths(args, layer: int) -> list[int]:
    """The widths of a layer's column-parallel inputs, which sequence parallelism all-gathers:
    linear_qkv's and linear_fc1's (h); with MLA the down projections' (h each) and the up
    projections' (their latents) in place of linear_qkv's. An MoE layer has an fc1 of that kind
    only in its shared expert (the routed experts' tokens travel in the dispatcher's dtype)."""
    h = args.hidden_size
    fc1 = [h] if not is_moe_layer(args, layer) or _flag(args, "moe_shared_expert_intermediate_size") else []
    if not _flag(args, "multi_latent_attention", False):
        return [h] + fc1
    if args.q_lora_rank is None:
        return [h, h, args.kv_lora_rank] + fc1
    return [h, h, args.q_lora_rank, args.kv_lora_rank] + fc1


def fp8_comm(args, pp_rank: int, tally, stage: list) -> None:
    """Add fp8's changes to one train_step's communication (theoretical_comm's tally:
    group key -> [bytes, calls]; ``stage``: the stage's buffers, stage_buffers' answer)."""
    if not _flag(args, "fp8"):
        return
    t, m = args.tensor_model_parallel_size, num_microbatches(args)
    e, b = DTYPE_BYTES[args.params_dtype], args.micro_batch_size
    rows = args.seq_length // args.context_parallel_size // t * b    # a rank's part of the sequence
    layers = [layer for chunk in chunks_of(args) for layer in chunk_layers(args, pp_rank, chunk)]
    casts = 3 * sum(len(_quantized_weights(args, pp_rank, chunk)) for chunk in chunks_of(args))
    if args.sequence_parallel and t > 1:   # each column input gathered twice, in 1 byte, not e
        widths = [w for layer in layers for w in _gathered_widths(args, layer)]
        tally["tp"][0] -= 2 * m * rows * sum(widths) * (e - 1)
        if args.fp8_recipe == "tensorwise":   # their amax, so that the gathered pieces share a scale
            tally.add("tp", 4, m * len(widths))
        if args.fp8_recipe == "mxfp8":        # and their e8m0 exponents, one byte per 32, both times
            for width in widths:
                tally.add("tp", rows * width // 32, 2 * m)
    gathered = _flag(args, "fp8_param_gather")
    weights = casts // 3
    if gathered:   # the forward casts no weight: the input and output-gradient slots remain
        casts -= weights
    dp_cp = args.data_parallel_size * args.context_parallel_size
    if args.fp8_recipe == "delayed" and t * dp_cp > 1:
        tally.add("tp-dp-cp", 4, m * casts)
        if gathered and weights:   # the optimizer's casts: every weight amax in one all-reduce
            tally.add("tp-dp-cp", 4 * weights)
    if gathered and args.fp8_recipe == "tensorwise" and dp_cp > 1 and weights:
        tally.add("dp-cp", 4 * weights)   # the shards' amaxes, before the cast
    if gathered and not _flag(args, "use_megatron_fsdp"):   # the distributed optimizer gathers the fp8
        # buffers in 1 byte, not e (Megatron-FSDP's fp8 units are counted so: theoretical_fsdp.py)
        for plist, (buckets, _) in stage:
            if _fp8_buffer(plist):
                tally["dp-cp"][0] -= sum(end - start for start, end in buckets) // dp_cp * (e - 1)
