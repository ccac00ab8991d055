"""The ds_config's ``optimizer`` section, as DeepSpeed 0.19.8's engine reads it
(``_configure_basic_optimizer``): its own Adam, AdamW and Lamb, and torch's SGD, read key by key
here; its Adagrad and Lion, mup's, and any other torch.optim class in basic_optimizer.py.

Under ZeRO (stage 1-3) DeepSpeed runs an optimizer it has not tested with ZeRO only when
``"zero_allow_untested_optimizer": true`` says so; config.py asks that once the stage is known.
"""

from __future__ import annotations

from typing import Optional

from minitron.runtime import basic_optimizer
from minitron.runtime.torch_names import spelled_as
from minitron.runtime.config_sections import _section, _typed_section
from minitron.runtime.config_values import DeepSpeedConfigError, check_keys, flag, json_value, number, \
    positive_int

# DeepSpeed's own optimizers are named in any case ("lamb", "LAMB"); any other type is looked up
# in torch.optim by its exact name (getattr(torch.optim, type)), so "SGD" is torch's SGD and
# "sgd" is DeepSpeed's AttributeError. Each with the keyword arguments its constructor takes.
OPTIMIZERS = {"Adam": ("lr", "betas", "eps", "weight_decay"), "AdamW": ("lr", "betas", "eps", "weight_decay"),
              "Lamb": ("lr", "bias_correction", "betas", "eps", "eps_inside_sqrt", "weight_decay", "max_coeff",
                       "min_coeff"),
              "SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"),
              # DeepSpeed 0.19.6's (0.19.7 removed it): runtime/fp16/onebit/adam.py says what runs
              "OneBitAdam": ("lr", "freeze_step", "bias_correction", "betas", "eps", "eps_inside_sqrt",
                             "weight_decay", "amsgrad", "cuda_aware", "comm_backend_name")}
TORCH_NAMED = ("SGD",)
# The optimizers DeepSpeed's ZeRO runs without asking (zero/utils.py's ZERO_SUPPORTED_OPTIMIZERS,
# those of them minitron builds): FusedAdam, torch's Adam/AdamW/Adagrad, CPU-Adagrad, both Lions.
# Lamb, SGD and torch's others are not among them.
ZERO_TESTED = ("Adam", "AdamW", "Adagrad", "Lion")


def parse_optimizer(params: dict) -> tuple[Optional[str], Optional[dict]]:
    """The optimizer and its params; None when the program passes its own optimizer. A section
    with no "type" names none: DeepSpeed's get_optimizer_name gives None, and its params are
    then not read at all (get_optimizer_params gives None too)."""
    if "type" not in _section(params, "optimizer"):
        check_keys(_section(params, "optimizer"), ("type", "params"), {}, "optimizer")
        return None, None
    other = basic_optimizer.resolve(_section(params, "optimizer").get("type"))
    if other is not None and other not in OPTIMIZERS:
        # DeepSpeed's Adagrad, Lion, mup's and Muon, or any torch.optim class: its params go to
        # its constructor unread, and config.py tries that constructor once the offload is known
        check_keys(_section(params, "optimizer"), ("type", "params"), {}, "optimizer")
        return other, dict(_section(_section(params, "optimizer"), "params"))
    _refuse_unknown(_section(params, "optimizer").get("type"))
    kind, opt = _typed_section(params, "optimizer", OPTIMIZERS,
                               any_case=tuple(n for n in OPTIMIZERS if n not in TORCH_NAMED))
    where = "optimizer.params"
    if "max_grad_norm" in opt:   # DeepSpeed's engine refuses it for every optimizer, with this advice
        raise DeepSpeedConfigError(f"{where}.max_grad_norm is not supported as an optimizer parameter; use the "
                                   f"top-level \"gradient_clipping\" instead")
    # torch's AdamW (torch_adam) has no bias_correction, so DeepSpeed's constructor refuses that key there.
    extra = ("adam_w_mode", "torch_adam", "amsgrad") + (() if opt.get("torch_adam") is True else ("bias_correction",)) \
        if kind in ("Adam", "AdamW") else ()
    check_keys(opt, OPTIMIZERS[kind] + extra, {}, where)
    if kind == "SGD":
        return kind, _sgd(opt, where)
    if kind == "OneBitAdam":
        return kind, _onebit_adam(opt, where)
    out = {"lr": number(opt, "lr", 1e-3, where, low=0),
           "eps": number(opt, "eps", 1e-8, where, low=0),
           "weight_decay": number(opt, "weight_decay", 0.0, where, low=0),
           "betas": _betas(opt)}
    if kind == "Lamb":
        out.update(bias_correction=flag(opt, "bias_correction", True, where),
                   eps_inside_sqrt=flag(opt, "eps_inside_sqrt", False, where),
                   max_coeff=number(opt, "max_coeff", 10.0, where, low=0),
                   min_coeff=number(opt, "min_coeff", 0.01, where, low=0))
        return kind, out
    if "adam_w_mode" in opt:   # DeepSpeed's "Adam" is AdamW unless this is false; "AdamW" always is
        out["adam_w_mode"] = flag(opt, "adam_w_mode", True, where)
    if "torch_adam" in opt:    # torch's Adam/AdamW instead of DeepSpeed's default FusedAdam
        out["torch_adam"] = flag(opt, "torch_adam", False, where)
    if "bias_correction" in opt:   # false: FusedAdam/CPU-Adam divide by neither 1 - beta1^t nor 1 - beta2^t
        out["bias_correction"] = flag(opt, "bias_correction", True, where)
    if flag(opt, "amsgrad", False, where):   # the running max of the second moments: torch's Adam has it
        if not out.get("torch_adam"):
            raise DeepSpeedConfigError(f"{where}.amsgrad: DeepSpeed's FusedAdam and CPU-Adam do not support the "
                                       f"AMSGrad variant (their constructors refuse it); add \"torch_adam\": true")
        out["amsgrad"] = True
    return kind, out


def _refuse_unknown(kind) -> None:
    """A type that is neither DeepSpeed's (any case) nor torch.optim's (as written): its refusal."""
    own = [n for n in OPTIMIZERS if n not in TORCH_NAMED] + list(basic_optimizer.DEEPSPEED_OWN)
    if isinstance(kind, str) and (kind.lower() in {n.lower() for n in own} or kind in TORCH_NAMED):
        return
    hint = ""
    case = spelled_as("torch.optim", kind) if isinstance(kind, str) else None   # which torch name was meant
    if case:
        hint = f"; DeepSpeed looks a torch optimizer up by its exact name: write {case!r}"
    raise DeepSpeedConfigError(f"optimizer.type {json_value(kind)} is neither DeepSpeed's own ({', '.join(own)}; any "
                               f"case) nor a torch.optim optimizer{hint}")


def _betas(opt: dict) -> list:
    betas = opt.get("betas", [0.9, 0.999])
    if (not isinstance(betas, list) or len(betas) != 2
            or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
        raise DeepSpeedConfigError(f"optimizer.params.betas must be two numbers in [0, 1), got {json_value(betas)}")
    return [float(b) for b in betas]


def _sgd(opt: dict, where: str) -> dict:
    """torch.optim.SGD's arguments, its defaults, and the two combinations its constructor refuses."""
    out = {"lr": number(opt, "lr", 1e-3, where, low=0), "momentum": number(opt, "momentum", 0.0, where, low=0),
           "dampening": number(opt, "dampening", 0.0, where), "weight_decay": number(opt, "weight_decay", 0.0, where,
                                                                                     low=0),
           "nesterov": flag(opt, "nesterov", False, where), "maximize": flag(opt, "maximize", False, where)}
    if out["nesterov"] and (out["momentum"] <= 0 or out["dampening"] != 0):
        raise DeepSpeedConfigError(f"{where}.nesterov needs a momentum > 0 and dampening 0 (torch.optim.SGD)")
    return out


def _onebit_adam(opt: dict, where: str) -> dict:
    """OnebitAdam's arguments and DeepSpeed 0.19.6's defaults. Its constructor refuses amsgrad;
    a comm_backend_name it does not know leaves it without a backend (its AttributeError)."""
    out = {"lr": number(opt, "lr", 1e-3, where, low=0), "eps": number(opt, "eps", 1e-8, where, low=0),
           "weight_decay": number(opt, "weight_decay", 0.0, where, low=0), "betas": _betas(opt),
           "freeze_step": positive_int(opt, "freeze_step", where=where, minimum=0) if "freeze_step" in opt else 100000,
           "bias_correction": flag(opt, "bias_correction", True, where),
           "eps_inside_sqrt": flag(opt, "eps_inside_sqrt", False, where),
           "cuda_aware": flag(opt, "cuda_aware", False, where),
           "comm_backend_name": opt.get("comm_backend_name", "nccl")}
    if flag(opt, "amsgrad", False, where):
        raise DeepSpeedConfigError(f"{where}.amsgrad: 1-bit Adam does not support the AMSGrad variant (DeepSpeed "
                                   f"refuses it too); leave it false")
    backend = out["comm_backend_name"]
    if backend in ("mpi", "hccl"):
        raise DeepSpeedConfigError(f"{where}.comm_backend_name {backend!r} is not built in minitron ("
                                   f"{'mpi4py point-to-point gathers' if backend == 'mpi' else 'Ascend torch_npu'}"
                                   f"); \"nccl\" or \"compressed\" run the same arithmetic over torch.distributed")
    if backend not in ("nccl", "compressed"):
        raise DeepSpeedConfigError(f"{where}.comm_backend_name must be \"nccl\", \"compressed\", \"mpi\" or "
                                   f"\"hccl\", got {json_value(backend)}")
    return out
