"""The DeepSpeed side of scripts/ds_config_surface.py: run by DeepSpeed 0.19.8's interpreter (never
by minitron's), it reads every ds_config file of a folder and prints one JSON line per file:

    {"file": ..., "accepted": true|false, "stage": "config"|"initialize", "reason": first line}

"config" is DeepSpeed's own DeepSpeedConfig(path, mpu): the object deepspeed.initialize builds
first, at a data-parallel size the mpu gives (a 1-rank gloo group is set up, because
DeepSpeedConfig asks the process group for the rank before it asks the mpu for the size).
DeepSpeedConfig does not look inside the optimizer's and scheduler's params, nor ask whether
ZeRO has tested the optimizer; the engine does, in deepspeed.initialize, before a step runs.
Those checks are made here too ("initialize"), with DeepSpeed's own pieces and no model: the
scheduler constructed as _scheduler_from_config constructs it, a torch.optim optimizer as
_configure_basic_optimizer does, a DeepSpeed optimizer's arguments bound to its constructor's
signature (its kernels are not built on a CPU), ZeRO's untested-optimizer assertion,
max_grad_norm's refusal, the monitors rank 0 builds, and deepspeed.checkpointing.configure (what
Megatron calls with the config for ZeRO-R). A failure reads as its exception's first line.

    DS_ACCELERATOR=cpu /tmp/vds/bin/python scripts/ds_config_surface_peer.py FOLDER DP
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import sys
import tempfile
from pathlib import Path


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


class _Mpu:
    """The one question DeepSpeedConfig asks a model-parallel unit."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self):
        return self.dp


def _one_rank_group():
    with socket.socket() as s:   # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed
    # DeepSpeed's CPU backend JIT-builds its shared-memory all-reduce into a cache other runs
    # share; a config needs no collective, so the op is marked unavailable, as on a host
    # without a compiler, and the rendezvous is plain gloo.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)


def _optimizer(config):
    """The engine's _configure_basic_optimizer and _do_optimizer_sanity_check, without a model."""
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS
    name, params = config.optimizer_name, dict(config.optimizer_params or {})
    if name is None:
        return
    if "max_grad_norm" in params:
        raise ValueError("'max_grad_norm' is not supported as an optimizer parameter (the engine's refusal)")
    weights = [torch.nn.Parameter(torch.zeros(4))]
    if name in DEEPSPEED_OPTIMIZERS:
        cls = _deepspeed_optimizer(name, params, config)
        if cls is None:
            return
        inspect.signature(cls).bind(weights, **params)   # its kernel is CUDA-only here: the arguments only
        instance_type = cls
    else:
        instance_type = type(getattr(torch.optim, name)(weights, **params))
    if config.zero_enabled and instance_type not in ZERO_SUPPORTED_OPTIMIZERS:
        assert config.zero_allow_untested_optimizer, ("You are using an untested ZeRO Optimizer. Please add "
                                                      "<\"zero_allow_untested_optimizer\": true> in the config")


def _deepspeed_optimizer(name, params, config):
    """The class the engine builds for a DeepSpeed-named optimizer (get_optimizer_configuration);
    None where it needs a package this venv lacks (mup) or compiles kernels at construction (Muon)."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
    from deepspeed.ops.lamb import FusedLamb
    from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion
    offloaded = config.zero_config.offload_optimizer is not None and \
        str(config.zero_config.offload_optimizer.device) not in ("none", "OffloadDeviceEnum.none")
    if name in ("adam", "adamw"):
        params.pop("adam_w_mode", None)
        params.pop("fp32_optimizer_states", None)
        if params.pop("torch_adam", False):
            params.pop("foreach", None)
            return torch.optim.AdamW
        return DeepSpeedCPUAdam if offloaded else FusedAdam
    if name == "adagrad":
        return torch.optim.Adagrad
    if name == "lamb":
        return FusedLamb
    if name == "lion":
        return DeepSpeedCPULion if offloaded else FusedLion
    return None


def _scheduler(config):
    import torch
    from deepspeed.runtime import lr_schedules
    name = config.scheduler_name
    if name is None:
        return
    if hasattr(lr_schedules, name):
        cls = getattr(lr_schedules, name)
    else:
        assert hasattr(torch.optim.lr_scheduler, name), f"DeepSpeed does not recognize LR scheduler {name}"
        cls = getattr(torch.optim.lr_scheduler, name)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=0.1)
    cls(optimizer, **(config.scheduler_params or {}))


def _monitors_and_checkpointing(config, path: Path):
    """The monitors deepspeed.initialize builds on rank 0 (each imports its package: a missing one
    is its ImportError), and deepspeed.checkpointing.configure, which Megatron calls with the
    config to set ZeRO-R up (its assertions on contiguous_memory_optimization)."""
    from deepspeed.monitor.monitor import MonitorMaster
    if config.monitor_config.enabled:
        MonitorMaster(config.monitor_config)
    if "activation_checkpointing" in config._param_dict:
        import deepspeed
        deepspeed.checkpointing.configure(None, deepspeed_config=str(path))


def verdict(path: Path, dp: int) -> dict:
    from deepspeed.runtime.config import DeepSpeedConfig
    try:
        config = DeepSpeedConfig(str(path), mpu=_Mpu(dp))
    except BaseException as exc:   # AssertionError, pydantic's ValidationError, TypeError...: all refusals
        return {"file": path.name, "accepted": False, "stage": "config", "reason": _first_line(exc)}
    try:
        _optimizer(config)
        _scheduler(config)
        _monitors_and_checkpointing(config, path)
    except BaseException as exc:
        return {"file": path.name, "accepted": False, "stage": "initialize", "reason": _first_line(exc)}
    return {"file": path.name, "accepted": True, "stage": "initialize", "reason": None}


def main(folder: str, dp: str) -> int:
    import logging
    os.chdir(tempfile.mkdtemp(prefix="ds-surface-peer-"))   # where a monitor writes its files
    _one_rank_group()
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)   # its warnings are not verdicts
    for path in sorted(Path(folder).glob("*.json")):
        print(json.dumps(verdict(path, int(dp))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
