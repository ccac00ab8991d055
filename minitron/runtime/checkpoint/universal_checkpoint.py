"""Loading a universal checkpoint into the ZeRO optimizer (``deepspeed/checkpoint/
universal_checkpoint.py``'s load_hp_checkpoint_state and the optimizers'
``_load_universal_checkpoint``), at any data-parallel size and any stage 0-3.

Every rank reads each parameter of its groups whole from ``zero/<name>/`` and lays the
parameters out as its own optimizer does, then keeps the elements its partition holds:

    stages 0-2   the group's parameters end to end, zero-padded to the flat buffer's length,
                 cut into partition_count equal runs: partition r is run r (stage 0: all of it)
    stage 3      each parameter padded to ceil(numel / dp) x dp and cut into dp pieces;
                 partition r is piece r of every parameter, end to end

fp32 becomes the master, exp_avg and exp_avg_sq the Adam's state for it, and the
model's weights are copied from the masters (``_publish``), so the module's own entries in the
model-states file are not read: the masters are the truth, as DeepSpeed has it. The step count
comes from a parameter's step.pt, or, from stage 3, from optimizer_state.pt. The loss scaler
and the param groups' hyperparameters (the learning rate among them) come from
optimizer_state.pt, as DeepSpeed's ``_load_global_state`` takes them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from minitron.runtime.checkpoint import constants as C
from minitron.runtime.checkpoint.adam_state import running_form
from minitron.runtime.checkpoint.pickles import load_state
from minitron.runtime.checkpoint.zero_checkpoint import optimizer_groups, scaler_state
from minitron.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3


def _whole(zero: Path, name: str, key: str, numel: int) -> torch.Tensor:
    """One parameter's state, flat, in fp32: the dict DeepSpeed writes from stages 1-2, or the
    bare tensor it writes from stage 3."""
    path = zero / name / f"{key}.pt"
    if not path.is_file():
        raise ValueError(f"{zero} has no {name}/{key}.pt: load the universal checkpoint into the model it was "
                         "converted from (same parameter names), or convert the checkpoint again")
    saved = load_state(path)
    tensor = (saved[C.PARAM] if isinstance(saved, dict) else saved).reshape(-1).float()
    if tensor.numel() != numel:
        raise ValueError(f"{path} holds {tensor.numel()} elements, this model's {name} has {numel}: load it into "
                         "the model it was converted from")
    return tensor


def _my_partition(opt, i: int, whole: list) -> torch.Tensor:
    """This rank's partition of group i, cut from the group's whole tensors as its optimizer
    cut the model's (stage 3: zero/stage3.py; stages 0-2: zero/stage_1_and_2.py). On the host,
    as the files' tensors are (load_state maps them there): the master's copy_ and the Adam's
    load_state_dict put each partition on the optimizer's device."""
    if isinstance(opt, DeepSpeedZeroOptimizer_Stage3):
        dp, r, pieces = opt.partition_count, opt.partition_id, []
        for tensor in whole:
            piece = -(-tensor.numel() // dp)
            padded = tensor.new_zeros(piece * dp)
            padded[:tensor.numel()].copy_(tensor)
            pieces.append(padded[r * piece:(r + 1) * piece])
        return torch.cat(pieces) if pieces else torch.zeros(0)  # host: as the files' tensors (see below)
    flat = torch.zeros(opt.bit16_groups_flat[i].numel())  # host: copied onto the device by the caller
    if whole:
        joined = torch.cat(whole)
        flat[:joined.numel()].copy_(joined)
    size = flat.numel() // opt.partition_count
    return flat[opt.partition_id * size:(opt.partition_id + 1) * size]


def _step(zero: Path, names: list, common: dict) -> torch.Tensor:
    """Adam's step count: any parameter's step.pt (stages 1-2 wrote one per parameter, all
    equal), else the first state of the stage-3 optimizer state dict kept in optimizer_state.pt."""
    for name in names:
        if (zero / name / "step.pt").is_file():
            return torch.tensor(float(load_state(zero / name / "step.pt")))  # host: where torch's Adam counts
    saved = common.get(C.OPTIMIZER_STATE_DICT, {}).get("state", {})
    steps = [float(s["step"]) for s in saved.values() if "step" in s]
    if not steps:
        raise ValueError(f"{zero} holds no step count (no step.pt, none in {C.UNIVERSAL_OPTIMIZER_STATE}): "
                         "convert the checkpoint again")
    return torch.tensor(max(steps))  # host: where torch's Adam counts


@torch.no_grad()
def load_universal_state(opt, zero: Path, names: dict) -> None:
    """Fill ``opt`` (stage 0-3, minitron's ZeRO optimizer) from ``zero``, the universal
    checkpoint's ``zero/`` folder. ``names`` maps each parameter to its name in the module."""
    common = load_state(zero / C.UNIVERSAL_OPTIMIZER_STATE)
    groups, saved_groups = optimizer_groups(opt), common[C.PARAM_GROUPS]
    # stage 3's groups are sub-groups (sub_group_size), each owned by one of the torch optimizer's groups
    owner = getattr(opt, "sub_group_to_group_id", list(range(len(groups))))
    if len(saved_groups) != len(opt.optimizer.param_groups):
        raise ValueError(f"{zero} was saved with {len(saved_groups)} param groups, this optimizer has "
                         f"{len(opt.optimizer.param_groups)}: build the optimizer's param groups as the saving "
                         "run did")
    step = _step(zero, [names[p] for params in groups for p in params], common)
    state = {}
    for i, params in enumerate(groups):
        # At stage 3 a released parameter's own numel is 0; ds_numel is its whole size.
        parts = {key: _my_partition(opt, i, [_whole(zero, names[p], key, getattr(p, "ds_numel", p.numel()))
                                             for p in params])
                 for key in C.UNIVERSAL_STATES}
        opt.single_partition_of_fp32_groups[i].copy_(parts[C.FP32_WEIGHT_KEY])
        state[i] = {"step": step.clone(), "exp_avg": parts["exp_avg"], "exp_avg_sq": parts["exp_avg_sq"]}
    param_groups = [{**saved, "params": [i for i, g in enumerate(owner) if g == k]}
                    for k, saved in enumerate(saved_groups)]
    # The saved hyperparameters, the count in the running Adam's type (adam_state.py).
    opt.optimizer.load_state_dict(running_form(opt.optimizer, {"state": state, "param_groups": param_groups}))
    opt.loss_scaler.load_state_dict(scaler_state(opt.loss_scaler, common[C.LOSS_SCALER]))
    for i in range(len(groups)):
        opt._publish(i)
