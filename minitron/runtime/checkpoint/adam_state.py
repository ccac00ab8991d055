"""Adam's state in the two forms DeepSpeed's files hold it, and the one form a loader needs.

A ds_config's "Adam" runs DeepSpeed's FusedAdam (the default) or, with ``"torch_adam": true``,
torch's Adam/AdamW, and each pickles its own form:

                        FusedAdam (minitron/ops/adam)             torch.optim.AdamW
    param group keys    lr bias_correction betas eps               lr betas eps weight_decay amsgrad
                        weight_decay step                          foreach maximize capturable ...
    step count          an int in each parameter's state           a tensor in each parameter's state
                        (DeepSpeed: only a group's last one
                        counts, the others say 0)

Either optimizer steps on in the other's file once it is put in its own form: the counts of a
group become the group's largest, in the running optimizer's type, and the param groups keep
the saved values of the keys the running optimizer has, its own values for the keys the file
lacks (FusedAdam's ``bias_correction`` from a torch file), and lose the others. DeepSpeed loads
only its own form; minitron loads both.
"""

from __future__ import annotations

import torch

from minitron.ops.adam import FusedAdam


def running_form(optimizer: torch.optim.Optimizer, saved: dict) -> dict:
    """``saved`` (an optimizer state dict, FusedAdam's or torch's, with as many param groups as
    ``optimizer``) in the form ``optimizer.load_state_dict`` takes and its step() runs on. The
    groups' parameter ids are kept: a state dict per parameter may go to a flat optimizer."""
    fused = isinstance(optimizer, FusedAdam)
    state = {k: dict(v) for k, v in saved["state"].items()}
    groups = []
    for group, own in zip(saved["param_groups"], optimizer.state_dict()["param_groups"]):
        held = [k for k in group["params"] if k in state]
        count = max([int(group.get("step", 0))] + [int(state[k].get("step", 0)) for k in held])
        for k in held:
            state[k]["step"] = count if fused else torch.tensor(float(count))  # host: torch's Adam counts there
        keys = [k for k in own if k != "params"]
        groups.append({**{k: group.get(k, own[k]) for k in keys}, "params": group["params"]})
    return {"state": state, "param_groups": groups}
