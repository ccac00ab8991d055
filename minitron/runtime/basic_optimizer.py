"""The optimizers a ds_config's ``optimizer.type`` builds beyond Adam, AdamW, Lamb and 1-bit Adam
(DeepSpeed 0.19.8's ``engine._configure_basic_optimizer``), checked before any rank starts.

DeepSpeed's rule: a name that, lower-cased, is one of its own (runtime/config.py's
DEEPSPEED_OPTIMIZERS) builds that one; any other name is looked up in ``torch.optim`` as written
(``getattr(torch.optim, type)``) and called with the model's parameters and the config's params,
unread. So "RMSprop" is torch's RMSprop with whatever keys torch's constructor takes, "rmsprop" is
DeepSpeed's AttributeError. Of its own, besides Adam/Lamb:

* Adagrad: torch.optim.Adagrad, or DeepSpeedCPUAdagrad when offload_optimizer keeps the states
  on the host (ops/adagrad/);
* Lion: FusedLion, or DeepSpeedCPULion under offload (ops/lion/: one arithmetic);
* MuAdam, MuAdamW, MuSGD: imported from the ``mup`` package (maximal-update parametrisation),
  which DeepSpeed does not ship;
* Muon: DeepSpeed's MuonWithAuxAdam (runtime/zero/muon/), not built in minitron (below).

Bad params are found here by building the optimizer once on a one-element parameter, so a
misspelt key or a negative lr is one line before any process starts, not a rank's traceback.
"""

from __future__ import annotations

import importlib.util

from minitron.runtime.config_values import DeepSpeedConfigError, json_value

# DeepSpeed's own names beyond config_optimizer.OPTIMIZERS' (any case), in minitron's spelling
DEEPSPEED_OWN = ("Adagrad", "Lion", "MuAdam", "MuAdamW", "MuSGD", "Muon")
MUP = ("MuAdam", "MuAdamW", "MuSGD")
# torch.optim classes that DeepSpeed builds and that then fail at the first step(): the engine
# steps its optimizer with no closure, and its gradients are dense.
FAILS_AT_STEP = {"LBFGS": "its step() needs a closure, which DeepSpeed's engine never passes",
                 "SparseAdam": "it takes sparse gradients only, and a model's gradients here are dense"}


def resolve(kind) -> str | None:
    """minitron's spelling of a type this module builds; None for one it does not."""
    if not isinstance(kind, str):
        return None
    own = {name.lower(): name for name in DEEPSPEED_OWN}
    if kind.lower() in own:
        return own[kind.lower()]
    return kind if _torch_class(kind) is not None else None


def _torch_class(name: str):
    if name.lower() in ("adam", "adamw", "lamb", "onebitadam"):   # DeepSpeed's own win, in any case
        return None
    import torch   # only for a config that names a torch optimizer: ds-config stays torch-free otherwise
    cls = getattr(torch.optim, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) else None


def optimizer_class(kind: str, offload: bool):
    """The class DeepSpeed's engine calls for ``kind`` (with the model's parameters and the params)."""
    if kind == "Adagrad":
        if offload:
            from minitron.ops.adagrad import DeepSpeedCPUAdagrad   # lazy: the ops import torch; a ds_config is read without it
            return DeepSpeedCPUAdagrad
        import torch   # lazy: a ds_config is read without torch
        return torch.optim.Adagrad
    if kind == "Lion":
        from minitron.ops.lion import DeepSpeedCPULion, FusedLion   # lazy: the ops import torch
        return DeepSpeedCPULion if offload else FusedLion
    if kind in MUP:
        import mup   # checked to be installed by check()
        return getattr(mup, kind)
    return _torch_class(kind)


def check(kind: str, params: dict, offload: bool) -> None:
    """Refuse, in one line, what DeepSpeed's engine would fail on when it builds or steps ``kind``."""
    where = f"optimizer.type {kind!r}"
    if kind in MUP and importlib.util.find_spec("mup") is None:
        raise DeepSpeedConfigError(f"{where} comes from the mup package (DeepSpeed imports it from there), which is "
                                   f"not installed: pip install mup, or name another optimizer")
    if kind == "Muon":
        raise DeepSpeedConfigError(f"{where}: DeepSpeed's MuonWithAuxAdam (runtime/zero/muon/: Newton-Schulz "
                                   f"orthogonalised momentum for 2-D weights, Adam for the rest) is not built in "
                                   f"minitron; use Adam, Lion, or a torch.optim optimizer")
    if kind in FAILS_AT_STEP:
        raise DeepSpeedConfigError(f"{where}: DeepSpeed builds torch's {kind} and fails at the first step ("
                                   f"{FAILS_AT_STEP[kind]}); name another optimizer")
    if "max_grad_norm" in params:   # DeepSpeed's engine refuses it for every optimizer, with this advice
        raise DeepSpeedConfigError("optimizer.params.max_grad_norm is not supported as an optimizer parameter; use "
                                   "the top-level \"gradient_clipping\" instead")
    if kind in MUP:   # mup's optimizers need the model's base shapes to build: nothing to try on one tensor
        return
    import torch   # lazy: a ds_config is read without torch; only a trial build of this type needs it
    cls = optimizer_class(kind, offload)
    try:
        cls([torch.nn.Parameter(torch.zeros(1))], **params)
    except (TypeError, ValueError, RuntimeError) as exc:
        # what torch's constructor says (an unexpected keyword, "Invalid learning rate: -1"), on one line
        reason = " ".join(str(exc).split())
        raise DeepSpeedConfigError(f"optimizer.params {json_value(params)} for {cls.__name__}: {reason}") from None


def build(kind: str, params: list, kwargs: dict, offload: bool):
    """The optimizer over ``params``, as DeepSpeed's engine builds it: the config's params passed through."""
    return optimizer_class(kind, offload)(params, **kwargs)
