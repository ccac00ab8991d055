"""What a layout costs each rank, worked out from the arguments alone: parameters, memory, and
the bytes it hands to communication in one training iteration. No process, no torch.

Megatron's file of this name answers "will it fit?" for the most loaded rank with two
formulas: 18 bytes per parameter (6 + 12/dp with the distributed optimizer) and the activation
table of "Reducing Activation Recomputation in Large Transformer Models". Here every rank gets
its own answer, and the answer is built from what *this* code allocates and sends, tensor by
tensor, so that it can be checked exactly against a traced run (`minitron estimate --check`).
The functions keep Megatron's names and roles, each answering for a named rank:
compute_weight_and_optimizer_memory, compute_activation_memory, and report_theoretical_memory,
which puts the two (and the communication) together for every rank. The pieces:

* parameters: the model's own list (theoretical_params.py), in the order the modules register
  them, cut by tp, pp and vp as the layers cut them;
* gradients: the DDP buffer those parameters are laid into, padded as param_and_grad_buffer_layout
  pads it for the distributed optimizer;
* optimizer: fp32 main copies (for a 16-bit model) and Adam's two moments, for the slice of
  the buffer this data-parallel rank owns with --use-distributed-optimizer;
* activations: what autograd saves for backward in one micro-batch of each model chunk, times
  the micro-batches the pipeline schedule keeps in flight (theoretical_activations.py);
* communication: every collective train_step makes, by group kind (the keys of
  `minitron groups --json`), with the bytes of the tensor handed to it; point-to-point, the
  bytes sent (theoretical_comm.py).

Covered: tp, pp (1F1B and interleaved), dp, cp (the ring), sequence parallelism, the
distributed optimizer, fp32/bf16/fp16, the modern options (rope, swiglu, RMSNorm, GQA, untied
embeddings), recomputation, and mixture-of-experts layers (theoretical_moe.py: exact when
padded to capacity, else the balanced-routing expectation for the all-to-alls), and
DeepSpeed's ZeRO stages 0-3 under --deepspeed (theoretical_zero.py), and Megatron-FSDP's sharding
strategies under --use-megatron-fsdp (theoretical_fsdp.py), and torch's FSDP2 under --use-torch-fsdp2
(theoretical_torch_fsdp2.py).
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, field

from minitron.core.distributed.distributed_data_parallel_config import (
    BUCKET_END_ALIGN, PARAM_START_ALIGN, resolve_bucket_size,
)
from minitron.core.rank_generator import RankGenerator
from minitron.training.theoretical_activations import in_flight_chunks, unit_activation_bytes
from minitron.training.theoretical_comm import _Tally, comm_bytes
from minitron.training.theoretical_fp8 import (
    fp8_activation_delta, fp8_comm, fp8_param_bytes, fp8_state_bytes, split_fp8_params,
)
from minitron.training.theoretical_params import (
    DTYPE_BYTES, Param, chunks_of, model_params, num_microbatches, optimizer_moments, round_up, total_params,
)
from minitron.training.theoretical_zero import zero_memory
from minitron.training.theoretical_fsdp import fsdp_memory, fsdp_piece_sums
from minitron.training.theoretical_torch_fsdp2 import torch_fsdp2_memory
from minitron.training.theoretical_moe import has_experts, is_expert_buffer, shards, split_buffers


@dataclass
class RankCost:
    """One rank's (or one role's) answer; ``comm`` maps a group key to bytes."""
    rank: int
    role: tuple
    params: int
    memory: dict
    comm: dict = field(default_factory=dict)
    calls: dict = field(default_factory=dict)   # group key -> number of calls

    def as_json(self) -> dict:
        return {"rank": self.rank, "params": self.params, "memory_bytes": dict(self.memory),
                "comm_bytes": dict(self.comm)}


# --- the gradient buffer ----------------------------------------------------------------------
def buffer_layout(params: list[Param], dp: int, dist_opt: bool,
                  bucket_size: int | None = None) -> tuple[list[tuple[int, int]], dict]:
    """_ParamAndGradBuffer._lay_out (param_and_grad_buffer_layout.py) without tensors: the
    buckets [(start, end)] and each parameter's (start, end). Parameters are laid out last
    first; a bucket closes once it holds ``bucket_size`` elements (None: one bucket); with the
    distributed optimizer each parameter starts on a 64-element boundary, each bucket ends on
    lcm(dp, 128), and the tied embedding has a bucket of its own."""
    align = math.lcm(dp, BUCKET_END_ALIGN)
    buckets, where, next_free, bucket_start, in_bucket = [], {}, 0, 0, 0

    def close(end: int) -> int:
        nonlocal bucket_start, in_bucket
        padded = round_up(end, align) if dist_opt else end
        buckets.append((bucket_start, padded))
        bucket_start, in_bucket = padded, 0
        return padded

    for param in reversed(params):
        start = round_up(next_free, PARAM_START_ALIGN) if dist_opt else next_free
        alone = dist_opt and param.shared_embedding
        if alone and in_bucket:
            start = close(start)
        where[param.name] = (start, start + param.numel)
        in_bucket += 1
        full = bucket_size is not None and start + param.numel - bucket_start >= bucket_size
        next_free = close(start + param.numel) if alone or full else start + param.numel
    if in_bucket:
        close(next_free)
    return buckets, where


def owned_numel(layout: tuple[list, dict], dp: int, dp_rank: int, spans: list | None = None) -> int:
    """Elements of real parameters inside this data-parallel rank's shards (its optimizer
    state), from buffer_layout's answer: padding is nobody's. ``spans``: the layout's
    parameter spans sorted, if the caller has them (_Stage keeps them for every rank's call)."""
    buckets, where = layout
    spans = sorted(where.values()) if spans is None else spans
    owned = 0
    for start, end in buckets:
        size = (end - start) // dp
        lo, hi = start + dp_rank * size, start + (dp_rank + 1) * size
        i = max(bisect.bisect_right(spans, (lo, math.inf)) - 1, 0)   # spans are disjoint and sorted
        while i < len(spans) and spans[i][0] < hi:
            a, b = spans[i]
            owned += max(0, min(b, hi) - max(a, lo))
            i += 1
    return owned


# --- memory -----------------------------------------------------------------------------------
class _Stage(list):
    """stage_buffers' answer, [(parameters, buffer layout)] per buffer, with what every rank of
    the stage reads from it worked out once: with the distributed optimizer each data-parallel
    rank is a role of its own (1,024 of them at tp = pp = 1 on 1,024 ranks), and summing the
    stage's parameters and sorting its spans for each was most of the estimate's time."""

    @functools.cached_property
    def numel(self) -> int:
        return sum(p.numel for plist, _ in self for p in plist)

    @functools.cached_property
    def buffered(self) -> int:
        return sum(layout[0][-1][1] for _, layout in self if layout[0])

    @functools.cached_property
    def spans(self) -> list[list]:
        return [sorted(layout[1].values()) for _, layout in self]


def stage_buffers(args, pp_rank: int) -> _Stage:
    """Each model chunk of a pipeline stage: its parameters and its buffer layout."""
    def layout_for(chunk):
        # DDP's rule (resolve_bucket_size): buckets with --overlap-grad-reduce, on the first
        # stage's first chunk only, sized from the dense data-parallel group, experts' too.
        dense_dp = args.data_parallel_size * args.context_parallel_size
        size = resolve_bucket_size(getattr(args, "ddp_bucket_size", None), getattr(args, "overlap_grad_reduce", False),
                                   dense_dp, disable_bucketing=pp_rank > 0 or chunk > 0)
        return lambda plist, dp: buffer_layout(plist, dp, args.use_distributed_optimizer, size)
    # Experts (theoretical_moe.py) get a buffer of their own, over the expert-data-parallel group.
    return _Stage(entry for chunk in chunks_of(args)
                  for entry in split_fp8_params(args, split_buffers(args, model_params(args, pp_rank, chunk),
                                                                    layout_for(chunk)), layout_for(chunk)))


def compute_weight_and_optimizer_memory(args, stage: list, dp_rank: int, expert_dp_rank: int = 0,
                                        pp_rank: int = 0) -> tuple[int, dict]:
    """(parameters on the rank, {"params", "grads", "optimizer"} bytes); ``stage`` is
    stage_buffers' answer for the rank's pipeline stage.

    Megatron's function of this name answers for the most loaded rank with 18 bytes per
    parameter (6 + 12/dp with the distributed optimizer: bf16 weights, fp32 gradients, fp32
    main weights and Adam moments). Here the rank is named and the bytes follow its dtypes, its
    optimizer and the padding of the buffer it holds."""
    if getattr(args, "deepspeed", False):   # DeepSpeed's engine holds ZeRO's partitions instead
        return zero_memory(args, stage[0][0], dp_rank)
    if getattr(args, "use_megatron_fsdp", False):   # Megatron-FSDP's units and shards instead
        return fsdp_memory(args, dp_rank, pp_rank, expert_dp_rank)
    if getattr(args, "use_torch_fsdp2", False):   # torch's FSDP2: every parameter's rows cut over dp
        return torch_fsdp2_memory(args, dp_rank)
    e = DTYPE_BYTES[args.params_dtype]
    grad_e = 4 if args.accumulate_allreduce_grads_in_fp32 else e
    dp, dist_opt = args.data_parallel_size * args.context_parallel_size, args.use_distributed_optimizer
    stage = stage if isinstance(stage, _Stage) else _Stage(stage)
    params, buffered = stage.numel, stage.buffered
    owned = sum(owned_numel(layout, shards(args, plist, dp), expert_dp_rank if is_expert_buffer(plist) else dp_rank,
                            spans) for (plist, layout), spans in zip(stage, stage.spans)) if dist_opt else params
    main_copy = 4 if e != 4 else 0   # a 16-bit model is stepped through fp32 main params
    return params, {"params": (buffered if dist_opt else params) * e, "grads": buffered * grad_e,
                    "optimizer": owned * (4 * optimizer_moments(args) + main_copy)}


def compute_activation_memory(args, num_microbatches: int, pp_rank: int = 0) -> int:
    """Bytes of activations a pipeline stage holds at the schedule's peak: what one micro-batch
    leaves for backward in each model chunk (theoretical_activations.py), for every chunk-
    micro-batch in flight. Megatron's answers for the first stage (the most loaded) from the
    paper's per-layer table; here any stage, from what this code's kernels save."""
    return sum(unit_activation_bytes(args, pp_rank, chunk) + fp8_activation_delta(args, pp_rank, chunk)
               for chunk in in_flight_chunks(args, pp_rank, num_microbatches))


# --- every rank -------------------------------------------------------------------------------
def role_of(args, rank: int) -> tuple[int, int, int]:
    """(pipeline rank, data-parallel rank, expert-data-parallel rank): all a rank's costs
    depend on (the last two only through its optimizer shards, so 0 without the distributed
    optimizer)."""
    return _roles(args)(rank)


def _roles(args):
    """rank -> role, reading the rank's digits in the layout's mixed radix (rank_generator)."""
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    dense = RankGenerator(tp=tp, ep=1, dp=args.world_size // (tp * pp * cp), pp=pp, cp=cp, order=args.order)
    etp, ep = getattr(args, "expert_tensor_parallel_size", None) or tp, getattr(args, "expert_model_parallel_size", 1)
    expert = RankGenerator(tp=etp, ep=ep, dp=args.world_size // (etp * ep * pp), pp=pp, cp=1, order=args.order)

    def digits_of(generator, rank: int) -> dict:
        digits = {}
        for d in generator.order:
            digits[d], rank = rank % generator.size[d], rank // generator.size[d]
        return digits

    def role(rank: int) -> tuple[int, int, int]:
        digits = digits_of(dense, rank)
        dp_rank = digits["dp"] * cp + digits["cp"]   # its place in the dp-cp group
        if not (args.use_distributed_optimizer or getattr(args, "deepspeed", False)
                or getattr(args, "use_megatron_fsdp", False) or getattr(args, "use_torch_fsdp2", False)):
            return digits["pp"], 0, 0   # no optimizer shard: every data-parallel rank alike
        return digits["pp"], dp_rank, digits_of(expert, rank)["dp"] if has_experts(args) else 0
    return role


def report_theoretical_memory(args) -> list[RankCost]:
    """One RankCost per rank of ``args.world_size`` (validated pretrain args): the two sums
    above, and the communication, for each rank. A pipeline stage is worked out once, a role
    (stage, optimizer shard) once, whatever the world size.

    Megatron's report_theoretical_memory prints the most loaded rank's weight-and-optimizer and
    activation megabytes when training starts; here it returns every rank's bytes, and
    `minitron estimate` prints them (or sets them beside a traced run) before anything starts."""
    stages: dict[int, tuple] = {}
    roles: dict[tuple, RankCost] = {}
    out, role_of_rank = [], _roles(args)
    for rank in range(args.world_size):
        role = role_of_rank(rank)
        if role[0] not in stages:
            stage = stage_buffers(args, role[0])
            activations = compute_activation_memory(args, num_microbatches(args), role[0])
            tally = comm_bytes(args, role[0], stage)
            fp8_comm(args, role[0], tally, stage)   # fp8 gathers and amax reductions (theoretical_fp8.py)
            stages[role[0]] = stage, activations, tally
        if role not in roles:
            stage, activations, tally = stages[role[0]]
            params, memory = compute_weight_and_optimizer_memory(args, stage, role[1], role[2], role[0])
            if getattr(args, "use_megatron_fsdp", False):   # finalize's sums on this rank's pieces
                tally = _Tally({k: list(v) for k, v in tally.items()})
                fsdp_piece_sums(args, tally, role[0], role[1])
            else:   # --fp8-param-gather's one-byte weights (Megatron-FSDP's units count them)
                memory["params"] -= fp8_param_bytes(args, stage)
            memory["activations"] = activations
            if getattr(args, "fp8", None):   # scales and amax histories (theoretical_fp8.py)
                memory["fp8_state"] = fp8_state_bytes(args, role[0])
            roles[role] = RankCost(rank, role, params, memory, {k: v[0] for k, v in tally.items()},
                                   {k: v[1] for k, v in tally.items()})
        cost = roles[role]
        out.append(RankCost(rank, role, cost.params, cost.memory, cost.comm, cost.calls))
    return out
