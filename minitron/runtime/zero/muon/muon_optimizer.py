"""``deepspeed/runtime/zero/muon/muon_optimizer.py``: MuonWithAuxAdam, what a ds_config's
``"optimizer": {"type": "Muon"}`` builds, with the engine's part (tagging the parameters,
splitting the groups) that DeepSpeed keeps in ``deepspeed/__init__.py`` and ``engine.py``.

Muon is defined on matrices, so one optimizer runs two rules:

* a parameter of two or more dimensions whose name holds neither "embed" nor "lm_head" is
  tagged ``use_muon = True`` (``set_optimizer_flags``) and steps along its orthogonalised
  momentum (original_muon.py): ``w <- w (1 - lr wd) - lr NS(nesterov momentum)``;
* everything else (biases, norms, embeddings, an output head named lm_head) steps with an
  auxiliary Adam, DeepSpeed's FusedAdam over those groups, sharing this optimizer's state.

Each incoming param group is split into a Muon half and an Adam half; the config's ``lr`` goes
to both unless ``muon_lr`` / ``adam_lr`` say otherwise; ``momentum`` and ``ns_method`` are
Muon's, ``betas`` and ``eps`` Adam's (defaults 0.02 / 0.95 / "gram" and 3e-4 / (0.9, 0.95) /
1e-10 — not FusedAdam's own).

Where the orthogonalisation runs: on a 2-D weight, in ``step``. Under minitron's ZeRO optimizer
the torch optimizer sees one flat fp32 master per group instead, so the matrix shapes are gone
by ``step``; there, as in DeepSpeed's ZeRO 1-2, the ZeRO optimizer orthogonalises each matrix's
slice of the gradient first (``orthogonalise_flat_gradient``) and ``step`` only applies it.
"""

from __future__ import annotations

import torch

from minitron.runtime.zero.muon import ADAM_KEYS, MUON_KEYS, NS_METHODS
from minitron.runtime.zero.muon.original_muon import muon_update


def set_optimizer_flags(model: torch.nn.Module) -> None:
    """Tag every parameter use_muon True/False by its shape and name (DeepSpeed's rule: embeddings
    and an lm_head are matrices that Muon's authors leave to Adam)."""
    for name, p in model.named_parameters():
        p.use_muon = p.dim() >= 2 and not any(word in name.lower() for word in ("embed", "lm_head"))


def muon_param_groups(model_parameters, config_params: dict) -> list:
    """Each incoming group split into its Muon and Adam halves, settings resolved config, then
    muon_lr/adam_lr, then the group's own: a no-decay group for biases keeps its decay of 0."""
    groups, loose = [], []
    for item in model_parameters:
        (groups if isinstance(item, dict) else loose).append(item)
    if loose or not groups:
        groups.append({"params": loose})
    untagged = [p for g in groups for p in g["params"] if not hasattr(p, "use_muon")]
    if untagged:
        raise ValueError(f"Muon: {len(untagged)} parameters carry no use_muon tag (they are not the model's); "
                         f"set p.use_muon on them or pass them as part of the model")
    halves = []
    for use_muon, label, keys, lr_key in ((True, "muon", MUON_KEYS, "muon_lr"), (False, "adam", ADAM_KEYS, "adam_lr")):
        defaults = {k: config_params[k] for k in keys if k in config_params}
        if lr_key in config_params:
            defaults["lr"] = config_params[lr_key]
        halves.append((use_muon, label, keys, defaults))
    out = []
    for index, group in enumerate(groups):
        own = {k: v for k, v in group.items() if k != "params"}
        trainable = [p for p in group["params"] if p.requires_grad]
        for use_muon, label, keys, defaults in halves:
            half = [p for p in trainable if bool(p.use_muon) is use_muon]
            if half:
                settings = {**defaults, **{k: v for k, v in own.items() if k in keys}}
                # one group keeps DeepSpeed's plain names; several need a prefix to stay distinct
                prefix = own.get("name") or (f"group{index}" if len(groups) > 1 else None)
                name = f"{prefix}-{label}-params" if prefix else f"{label}-params"
                out.append(dict(params=half, use_muon=use_muon, name=name, **settings))
    return out


def aux_adam(config_params: dict):
    """The Adam class and keyword arguments for the non-Muon half (DeepSpeed's
    get_optimizer_configuration): torch's Adam/AdamW under torch_adam, else FusedAdam."""
    adam_w_mode = config_params.get("adam_w_mode", True)
    if config_params.get("torch_adam", False):
        return (torch.optim.AdamW if adam_w_mode else torch.optim.Adam), {"foreach": config_params.get("foreach")}
    from minitron.ops.adam import FusedAdam   # lazy: ops/adam imports the engine's arithmetic only when built
    return FusedAdam, {"adam_w_mode": adam_w_mode}


class MuonWithAuxAdam(torch.optim.Optimizer):
    def __init__(self, param_groups, adam_optimizer=None, adam_optimizer_kwargs=None, adam_w_mode=True):
        for group in param_groups:
            if group["use_muon"]:
                # largest first, as DeepSpeed orders them (its ZeRO layout follows this order)
                group["params"] = sorted(group["params"], key=lambda p: p.size(), reverse=True)
                for key, value in (("lr", 0.02), ("momentum", 0.95), ("weight_decay", 0), ("ns_method", "gram")):
                    group.setdefault(key, value)
                if group["ns_method"] not in NS_METHODS:
                    raise ValueError(f"Muon: ns_method must be one of {NS_METHODS}, got {group['ns_method']!r}")
            else:
                for key, value in (("lr", 3e-4), ("betas", (0.9, 0.95)), ("eps", 1e-10), ("weight_decay", 0)):
                    group.setdefault(key, value)
        super().__init__(param_groups, {})
        self.adam_w_mode = adam_w_mode
        self.aux_optimizer = None
        aux_groups = [g for g in self.param_groups if not g["use_muon"]]
        if aux_groups and adam_optimizer is not None:
            self.aux_optimizer = adam_optimizer(aux_groups, **(adam_optimizer_kwargs or {}))
            for group, built in zip(aux_groups, self.aux_optimizer.param_groups):
                for key, value in built.items():   # FusedAdam's own keys (bias_correction) join ours
                    group.setdefault(key, value)
            # one set of groups and one state dict: a checkpoint of this optimizer holds Adam's too
            self.aux_optimizer.param_groups = aux_groups
            self.aux_optimizer.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if not group["use_muon"]:
                continue
            for p in group["params"]:
                if p.grad is None:   # every rank steps every matrix, used this step or not
                    p.grad = torch.zeros_like(p)
                if p.dim() < 2:   # a ZeRO flat master: its gradient already holds the update
                    update = p.grad
                else:
                    state = self.state[p]
                    if not state:
                        state["momentum_buffer"] = torch.zeros_like(p)
                    update = muon_update(p.grad, state["momentum_buffer"], beta=group["momentum"],
                                         ns_method=group["ns_method"])
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update.reshape(p.shape), alpha=-group["lr"])
        if self.aux_optimizer is not None:
            self.aux_optimizer.param_groups = [g for g in self.param_groups if not g["use_muon"]]
            for group in self.aux_optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
            self.aux_optimizer.step()
        return loss


def orthogonalise_flat_gradient(optimizer, group: dict, master: torch.Tensor, params: list) -> None:
    """Replace each matrix's slice of a flat master's gradient by its Muon update, in place.

    The momentum is one flat buffer beside the master (state "momentum_buffer", DeepSpeed's
    ZeRO 1-2 key), each matrix's slice viewed in its own shape; the padding after the last
    matrix keeps a zero gradient and so a zero update. Runs after unscaling and clipping, the
    order DeepSpeed's stage 0 has (the engine clips, then the optimizer orthogonalises)."""
    state = optimizer.state[master]
    if "momentum_buffer" not in state:
        state["momentum_buffer"] = torch.zeros_like(master)
    momentum, offset = state["momentum_buffer"], 0
    for p in params:
        n = p.numel()
        grad = master.grad.narrow(0, offset, n)
        update = muon_update(grad.view(p.shape), momentum.narrow(0, offset, n).view(p.shape),
                             beta=group["momentum"], ns_method=group["ns_method"])
        grad.copy_(update.reshape(-1))
        offset += n


def build(module: torch.nn.Module, model_parameters: list, config_params: dict) -> MuonWithAuxAdam:
    """What DeepSpeed's initialize and engine do for "Muon": tag the module, split the groups,
    build the optimizer with its auxiliary Adam."""
    set_optimizer_flags(module)
    adam, adam_kwargs = aux_adam(config_params)
    return MuonWithAuxAdam(muon_param_groups(model_parameters, config_params), adam, adam_kwargs,
                           adam_w_mode=config_params.get("adam_w_mode", True))
