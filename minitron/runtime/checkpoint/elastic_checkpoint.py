"""``zero_optimization.elastic_checkpoint`` at ZeRO stages 1-2: the optimizer files in a form that
a run at another data-parallel size can cut again (DeepSpeed 0.19.8's ``DeepSpeedZeroOptimizer``:
``_get_base_optimizer_state``, ``_restore_elastic_base_optimizer_state``,
``_restore_from_elastic_fp32_weights``).

A rigid file holds the Adam's own state dict: my partition's moments *with* the padding that made
the dp partitions equal, so only a run with the same partitions can use them. An elastic file holds

    base_optimizer_state        a list, one dict per param group: each moment lean (padding cut
                                off, as the fp32 partition already is), the rest as it is
    base_optimizer_state_step   the groups' ``step`` (FusedAdam keeps a place-holder 0 there;
                                the counts that matter ride in each group's dict)

and the param groups' hyperparameters are not saved: the running optimizer keeps its own (the
lr comes back through the scheduler). On load every rank reads every rank's file, glues the lean
partitions of each group end to end (that is the group's whole flat buffer, in its order), pads it
for *this* run's dp size and takes its own partition: the same numbers, cut anew.

Where minitron goes beyond DeepSpeed 0.19.8: DeepSpeed's engine refuses a different dp size
whenever it loads optimizer states (``ZeRORuntimeException``: "Automatic adjustment of ZeRO's
optimizer state partitioning with a new world size is not currently supported"), and without
them a larger dp size fails on indexing the saved files by its own rank. minitron lets an elastic
checkpoint load at any dp size, which is what the layout above exists for.
"""

from __future__ import annotations

import torch

from minitron.runtime.checkpoint import constants as C
from minitron.runtime.zero.alignment import NCCL_START_ALIGNMENT_FACTOR


def lean_base_optimizer_state(opt, paddings: list) -> dict:
    """The two elastic keys of my optimizer file. ``paddings[i]``: how much of my partition of
    group i is padding (DeepSpeed's groups_padding; non-zero only on the last ranks)."""
    groups = opt.optimizer.param_groups
    lean = []
    for group, pad in zip(groups, paddings):
        state = opt.optimizer.state.get(group["params"][0], {})
        lean.append({k: v.detach()[:v.numel() - pad].clone() if _partitioned(v) else v for k, v in state.items()})
    out = {C.BASE_OPTIMIZER_STATE: lean}
    if "step" in groups[0]:
        steps = {g["step"] for g in groups}
        if len(steps) != 1:   # DeepSpeed asserts it too: one count is stored for all groups
            raise ValueError(f"elastic_checkpoint stores one step for all param groups; these have {sorted(steps)}")
        out[C.BASE_OPTIMIZER_STATE_STEP] = groups[0]["step"]
    return out


def is_elastic(state: dict) -> bool:
    """An elastic file's base_optimizer_state is a list per group; a rigid one's a state dict."""
    return isinstance(state.get(C.BASE_OPTIMIZER_STATE), list)


def _partitioned(value) -> bool:
    return torch.is_tensor(value) and value.dim() > 0


def my_partition(opt, i: int, lean_parts: list) -> torch.Tensor:
    """Every saved rank's lean piece of group i, glued, padded to a multiple of 2 x this run's dp
    (flatten_dense_tensors_aligned's rule, so the length equals this run's flat buffer's), and cut
    into this run's partitions: mine."""
    whole = torch.cat([p.reshape(-1).float() for p in lean_parts])
    align = NCCL_START_ALIGNMENT_FACTOR * opt.partition_count
    padded = whole.new_zeros(-(-whole.numel() // align) * align)
    padded[:whole.numel()].copy_(whole)
    size = padded.numel() // opt.partition_count
    if padded.numel() != opt.bit16_groups_flat[i].numel():
        raise ValueError(f"the checkpoint's param group {i} holds {whole.numel()} elements, this model's "
                         f"{sum(p.numel() for p in opt.bit16_groups[i])}: load it into the model it was saved from")
    return padded[opt.partition_id * size:(opt.partition_id + 1) * size]


@torch.no_grad()
def restore_elastic(opt, states: list, load_from_fp32_weights: bool) -> None:
    """Moments, step and (with load_from_fp32_weights) fp32 masters from every saved rank's file
    (``states``, in dp-rank order), re-cut for this run. A key is a partitioned moment when every
    rank's value has the shape of that rank's lean fp32 partition (DeepSpeed's test); any other
    value (a step count) is the same on every rank, and rank 0's is taken."""
    masters = C.SINGLE_PARTITION_OF_FP32_GROUPS
    for i, group in enumerate(opt.optimizer.param_groups):
        saved = [s[C.BASE_OPTIMIZER_STATE][i] for s in states]
        restored = {}
        for key in saved[0]:
            values = [g[key] for g in saved]
            if all(torch.is_tensor(v) and v.shape == s[masters][i].shape for v, s in zip(values, states)):
                restored[key] = my_partition(opt, i, values)
            else:
                restored[key] = values[0]
        _put(opt, group, restored)
        if load_from_fp32_weights:
            opt.single_partition_of_fp32_groups[i].copy_(my_partition(opt, i, [s[masters][i] for s in states]))
    if C.BASE_OPTIMIZER_STATE_STEP in states[0]:
        for group in opt.optimizer.param_groups:
            group["step"] = states[0][C.BASE_OPTIMIZER_STATE_STEP]


@torch.no_grad()
def restore_own_lean(opt, state: dict) -> None:
    """An elastic file loaded without elastic_checkpoint (DeepSpeed's _restore_base_optimizer_state):
    this rank's own lean moments, zero-padded back to its partition; the dp size must match."""
    for group, lean in zip(opt.optimizer.param_groups, state[C.BASE_OPTIMIZER_STATE]):
        _put(opt, group, lean)
    if C.BASE_OPTIMIZER_STATE_STEP in state:
        for group in opt.optimizer.param_groups:
            group["step"] = state[C.BASE_OPTIMIZER_STATE_STEP]


def _put(opt, group: dict, values: dict) -> None:
    """Into the Adam's state of the group's one flat master: tensors zero-padded to its length
    (the moments of an Adam that has not stepped yet do not exist: made here), others as given."""
    master = group["params"][0]
    state = opt.optimizer.state[master]
    for key, value in values.items():
        if _partitioned(value):
            full = torch.zeros(master.numel(), dtype=torch.float32, device=master.device)
            full[:value.numel()].copy_(value.reshape(-1))
            if key in state and torch.is_tensor(state[key]):
                state[key].copy_(full)
            else:
                state[key] = full
        else:
            state[key] = value.clone() if torch.is_tensor(value) else value
