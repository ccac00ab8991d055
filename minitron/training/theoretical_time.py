"""Seconds per iteration: the bytes and FLOPs the estimate already counts, priced on a cluster.

Nothing is recounted here. Each rank's bytes handed to each group kind come from
theoretical_comm.py (through report_theoretical_memory), the FLOPs from theoretical_flops.py;
this file turns them into time with textbook formulas, and says which.

The link. A group whose ranks all sit in one node (rank // gpus_per_node the same for all) talks
over NVLink; any other group is priced at the slowest link it crosses, InfiniBand. Bandwidth B
is per GPU per direction, latency α per message.

The collectives, N the bytes a rank hands to the call, p the group's size:

* all-reduce, ring: 2(p-1)/p · N/B + 2(p-1)·α. The ring reduce-scatters (p-1 steps of N/p)
  and then all-gathers (p-1 more): every rank sends 2(p-1)/p · N and waits 2(p-1) hops.
* all-reduce, tree: 2 · N/B + 2⌈log2 p⌉·α. A pipelined reduce up a binary tree, then a
  broadcast down it: each rank sends about N each way, but only log2 p hops deep. Fewer hops,
  more bytes: it wins for small messages and large groups, the ring for the big buckets
  (NCCL picks between them by size; we take the faster of the two, call kind by call kind).
* reduce-scatter then all-gather (the distributed optimizer's gradients and its updated
  shards): (p-1)/p of the gradient's bytes each, the gather of bf16 shards, the scatter of
  gradients in their own dtype; (p-1)·α per call.
* all-to-all (expert dispatch, a2a context parallelism): (p-1)/p · N/B + (p-1)·α: a rank keeps
  its own 1/p and sends the rest, one message per peer.
* send (pipeline neighbours, the context-parallel ring): N/B + α per message.

Every other group kind (tensor parallelism, the embedding, the optimizer's statistics, ZeRO's
calls) is priced as an all-reduce of what it is handed. For the tensor-parallel all-gathers and
reduce-scatters of --sequence-parallel that is an approximation: the page says so.

The compute. The model's FLOPs (Megatron's count) over world × peak × MFU, where MFU is the
fraction of peak the kernels reach while computing. Its default is the one minitron measured on
one H100 (docs/gpu-runs/2026-11-27-h100.json), read from that file, not typed here.

The iteration: compute + pipeline bubble + communication, one after another, no overlap (unless
Megatron's --overlap-grad-reduce / --overlap-param-gather say so, below). The 1F1B bubble is
(p-1) micro-batch times, (p-1)/v of them with v interleaved chunks: as a fraction of the
iteration (p-1)/(v·m + p-1). Not modelled: congestion, other jobs, stragglers, kernel launch
gaps, memory-bound kernels beyond what MFU folds in, and imbalance between stages.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from minitron.training.clusters import Cluster
from minitron.training.theoretical_flops import num_floating_point_operations
from minitron.training.theoretical_params import DTYPE_BYTES, num_microbatches

RECORDED_RUN = Path(__file__).resolve().parents[2] / "docs" / "gpu-runs" / "2026-11-27-h100.json"
SAMPLED_RANKS_PER_STAGE = 512   # huge worlds: the first ranks of each stage stand for it
DP_KEYS = ("dp-cp", "expt-dp")  # the gradient reduction's groups


def recorded_mfu(path: Path = RECORDED_RUN) -> tuple[float, str]:
    """(MFU, where it came from): minitron's own one-GPU H100 run, as its record states it."""
    run = json.loads(path.read_text())
    return run["results"]["minitron"]["mfu"], f"minitron on one {run['device']}, {path.name}"


@dataclass
class Link:
    name: str
    gb_s: float
    latency_us: float


def link_of(cluster: Cluster, ranks: list[int]) -> Link:
    """NVLink when every rank of the group sits in one node, else InfiniBand (the slower)."""
    if min(ranks) // cluster.gpus_per_node == max(ranks) // cluster.gpus_per_node:
        return Link("nvlink", cluster.nvlink_gb_s, cluster.nvlink_latency_us)
    return Link("ib", cluster.ib_gb_s, cluster.ib_latency_us)


def collective_of(args, key: str) -> str:
    """The collective that carries (most of) a group kind's bytes in one train_step."""
    if key == "pp":
        return "send"
    if key == "cp":
        kinds = args.cp_comm_type if isinstance(args.cp_comm_type, list) else [args.cp_comm_type]
        return "send" if set(kinds) == {"p2p"} else "all-to-all"
    if key == "ep" or key.startswith("HIERARCHICAL"):
        return "all-to-all"
    if key in DP_KEYS and args.use_distributed_optimizer and not getattr(args, "deepspeed", False):
        return "scatter+gather"
    return "all-reduce"


def ring_seconds(collective: str, nbytes: float, calls: int, p: int, link: Link, args=None) -> float:
    """The ring (or point-to-point) time of ``calls`` calls handing ``nbytes`` in all."""
    b, a = link.gb_s * 1e9, link.latency_us * 1e-6
    if collective == "send":
        return nbytes / b + calls * a
    if p == 1:
        return 0.0
    if collective == "all-to-all":
        return (p - 1) / p * nbytes / b + calls * (p - 1) * a
    if collective == "scatter+gather":
        # handed: the gradient G·g (reduce-scatter) plus its shard G·e/p (all-gather); the wire
        # carries (p-1)/p of G·g and of G·e
        g = 4 if args.accumulate_allreduce_grads_in_fp32 else DTYPE_BYTES[args.params_dtype]
        e = DTYPE_BYTES[args.params_dtype]
        elements = nbytes / (g + e / p)
        return (p - 1) / p * elements * (g + e) / b + calls * (p - 1) * a
    return 2 * (p - 1) / p * nbytes / b + calls * 2 * (p - 1) * a


def tree_seconds(collective: str, nbytes: float, calls: int, p: int, link: Link) -> float | None:
    """The double-tree all-reduce's time; None for the other collectives (no tree variant)."""
    if collective != "all-reduce":
        return None
    if p == 1:
        return 0.0
    return 2 * nbytes / (link.gb_s * 1e9) + calls * 2 * math.ceil(math.log2(p)) * link.latency_us * 1e-6


@dataclass
class GroupTime:
    key: str
    size: int
    link: str
    collective: str
    nbytes: int
    calls: int
    ring_s: float
    tree_s: float | None

    @property
    def seconds(self) -> float:
        return self.ring_s if self.tree_s is None else min(self.ring_s, self.tree_s)


def group_times(args, cost, cluster: Cluster) -> list[GroupTime]:
    """One rank's communication, group kind by group kind, priced on ``cluster``."""
    # lazy: rank_generator is light, but this keeps the import order of estimate's
    from minitron.core.group_layout import rank_layout

    layout = rank_layout(cost.rank, args.world_size, args.tensor_model_parallel_size,
                         args.pipeline_model_parallel_size, args.context_parallel_size,
                         args.expert_model_parallel_size, args.order, args.expert_tensor_parallel_size)
    out = []
    for key, nbytes in cost.comm.items():
        # a kind not in the layout (the hierarchical cp sub-groups): assume the world's span
        ranks = layout[key] if key in layout else range(args.world_size)
        if len(ranks) == 1 or not nbytes:
            continue
        link, kind, calls = link_of(cluster, ranks), collective_of(args, key), cost.calls.get(key, 1)
        out.append(GroupTime(key, len(ranks), link.name, kind, nbytes, calls,
                             ring_seconds(kind, nbytes, calls, len(ranks), link, args),
                             tree_seconds(kind, nbytes, calls, len(ranks), link)))
    return out


def _representatives(costs) -> tuple[list, bool]:
    """Every rank, or in a huge world the first SAMPLED_RANKS_PER_STAGE ranks of each stage."""
    seen: dict[int, int] = {}
    chosen = []
    for cost in costs:
        if seen.get(cost.role[0], 0) < SAMPLED_RANKS_PER_STAGE:
            seen[cost.role[0]] = seen.get(cost.role[0], 0) + 1
            chosen.append(cost)
    return chosen, len(chosen) < len(costs)


def hidden_seconds(args, key: str, compute_s: float) -> float:
    """How much of a group kind's time Megatron's overlap flags can hide. --overlap-grad-reduce
    launches each gradient bucket's reduction during the last micro-batch's backward (2/3 of a
    micro-batch's compute); --overlap-param-gather gathers the shards during the next
    iteration's first forward (1/3 of one). Nothing else overlaps in this model."""
    if key not in DP_KEYS:
        return 0.0
    per_microbatch = compute_s / num_microbatches(args)
    return per_microbatch * ((2 / 3 if getattr(args, "overlap_grad_reduce", False) else 0)
                             + (1 / 3 if getattr(args, "overlap_param_gather", False) else 0))


def iteration_time(args, costs, cluster: Cluster, mfu: float) -> dict:
    """Compute, bubble, communication (the slowest rank's) and their sum, in seconds."""
    flops = num_floating_point_operations(args, args.global_batch_size)
    compute_s = flops / (args.world_size * cluster.peak_tflops * 1e12 * mfu)
    p, m = args.pipeline_model_parallel_size, num_microbatches(args)
    v = args.virtual_pipeline_model_parallel_size or 1
    bubble_s = compute_s * (p - 1) / (v * m)
    chosen, sampled = _representatives(costs)
    worst, worst_s, worst_groups = None, -1.0, []
    for cost in chosen:
        groups = group_times(args, cost, cluster)
        seconds = sum(max(0.0, g.seconds - hidden_seconds(args, g.key, compute_s)) for g in groups)
        if seconds > worst_s:
            worst, worst_s, worst_groups = cost, seconds, groups
    total = compute_s + bubble_s + worst_s
    return {"cluster": cluster.name, "mfu": mfu, "flops_per_iteration": flops, "compute_s": compute_s,
            "bubble_s": bubble_s, "bubble_fraction": bubble_s / total if total else 0.0,
            "comm_s": worst_s, "iteration_s": total, "slowest_rank": worst.rank if worst else 0,
            "sampled": sampled, "microbatches": m, "virtual_stages": v,
            "effective_mfu": flops / (args.world_size * cluster.peak_tflops * 1e12 * total),
            "groups": [g.__dict__ | {"seconds": g.seconds, "hidden": hidden_seconds(args, g.key, compute_s) > 0}
                       for g in worst_groups]}
