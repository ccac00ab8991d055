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
* Muon: MuonWithAuxAdam (runtime/zero/muon/): orthogonalised momentum for the matrices, Adam for
  the rest; built at stage 0 in fp32 (``muon_refusal`` says why not beyond).

Bad params are found here by building the optimizer once on a one-element parameter, so a
misspelt key or a negative lr is one line before any process starts, not a rank's traceback.
"""

from __future__ import annotations

import importlib.util

from minitron.runtime.config_values import DeepSpeedConfigError, json_value
from minitron.runtime.torch_names import may_be_exported

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
    if not may_be_exported("torch.optim", name):   # a name torch lacks is refused without importing it
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
        try:
            import mup   # lazy: an optional package, not minitron's dependency; check() found it installed
        except ImportError:
            raise DeepSpeedConfigError(f"optimizer.type {kind!r} comes from the mup package, which is not "
                                       f"installed: pip install mup") from None
        return getattr(mup, kind)
    return _torch_class(kind)


def check(kind: str, params: dict, offload: bool) -> None:
    """Refuse, in one line, what DeepSpeed's engine would fail on when it builds or steps ``kind``."""
    where = f"optimizer.type {kind!r}"
    if kind in MUP and importlib.util.find_spec("mup") is None:
        raise DeepSpeedConfigError(f"{where} comes from the mup package (DeepSpeed imports it from there), which is "
                                   f"not installed: pip install mup, or name another optimizer")
    if kind == "Muon":
        _check_muon(params)
        return
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
        cls([torch.nn.Parameter(torch.zeros(1))], **params)   # host: a trial build before any rank, never stepped
    except (TypeError, ValueError, RuntimeError) as exc:
        # what torch's constructor says (an unexpected keyword, "Invalid learning rate: -1"), on one line
        reason = " ".join(str(exc).split())
        raise DeepSpeedConfigError(f"optimizer.params {json_value(params)} for {cls.__name__}: {reason}") from None


def build(kind: str, params: list, kwargs: dict, offload: bool):
    """The optimizer over ``params``, as DeepSpeed's engine builds it: the config's params passed through."""
    return optimizer_class(kind, offload)(params, **kwargs)


def _check_muon(params: dict) -> None:
    """Muon's params: DeepSpeed's engine reads the keys it knows and ignores the rest, so a
    misspelt "momentun" would silently train with 0.95; minitron names it instead."""
    from minitron.runtime.zero.muon import ADAM_KEYS, MUON_KEYS, NS_METHODS, OTHER_KEYS   # torch-free
    known = sorted(set(MUON_KEYS + ADAM_KEYS + OTHER_KEYS))
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise DeepSpeedConfigError(f"optimizer.params {unknown} for Muon: DeepSpeed reads none of them (it would "
                                   f"ignore them); its keys are {known}")
    if params.get("ns_method", "gram") not in NS_METHODS:
        raise DeepSpeedConfigError(f"optimizer.params.ns_method {json_value(params['ns_method'])} for Muon: one of "
                                   f"{list(NS_METHODS)}")
    if params.get("per_head_muon", False):   # needs each attention projection's head count
        raise DeepSpeedConfigError("optimizer.params.per_head_muon true is not built in minitron (DeepSpeed reads "
                                   "each attention projection's head count from a Hugging Face config); drop it")


def muon_refusal(stage: int, precision: str) -> str | None:
    """Why Muon cannot run here at this stage/precision, or None (stage 0, fp32)."""
    if stage >= 1:
        # DeepSpeed orthogonalises each matrix while it fills the flat gradient partitions, and a
        # matrix cut by a partition boundary needs the all-reduce of its whole gradient first
        # (stage_1_and_2.average_tensor); stage 3 gathers each sub-group's matrices. Not built here.
        return (f"optimizer.type Muon at zero_optimization.stage {stage} is not built in minitron (DeepSpeed "
                f"orthogonalises whole matrices while it partitions the gradients, all-reducing those a "
                f"partition splits); use stage 0")
    if precision != "fp32":
        # DeepSpeed's fp16 path unscales Muon's scale-free update and its BF16_Optimizer steps
        # fp32 matrices beside bf16 ones: neither is built here
        return f"optimizer.type Muon with {precision} is not built in minitron (it runs in fp32); disable {precision}"
    return None
