"""The DeepSpeed side of scripts/ds_config_surface.py: run by DeepSpeed 0.19.8's interpreter (never
by minitron's), it reads every ds_config file of a folder and prints one JSON line per file:

    {"file": ..., "accepted": true|false, "stage": "config"|"initialize", "reason": first line}

"config" is DeepSpeed's own DeepSpeedConfig(path, mpu): the object deepspeed.initialize builds
first, at a data-parallel size the mpu gives (a 1-rank gloo group is set up, because
DeepSpeedConfig asks the process group for the rank before it asks the mpu for the size).
DeepSpeedConfig does not look inside the optimizer's and scheduler's params, nor ask whether
ZeRO has tested the optimizer; the engine does, in deepspeed.initialize, before a step runs.
Those checks are made here too ("initialize") by DeepSpeed's own engine methods on an engine
that holds only the config (no model): _configure_basic_optimizer builds the optimizer (its op
kernels replaced by no-ops, so every constructor check runs: FusedAdam's AMSGrad refusal, mup's
missing package), _do_optimizer_sanity_check (ZeRO's untested-optimizer assertion), and
_scheduler_from_config is handed the optimizer the engine would hand it: the ZeRO, fp16 or bf16
wrapper's class where one wraps it, which torch's schedules refuse. Then the monitors rank 0
builds, and deepspeed.checkpointing.configure (what Megatron calls with the config for ZeRO-R).
A failure reads as its exception's first line.

    DS_ACCELERATOR=cpu /tmp/vds/bin/python scripts/ds_config_surface_peer.py FOLDER DP
"""

from __future__ import annotations

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


class _NoKernel:
    """What a DeepSpeed op builder's load() returns here: every call on the op is a no-op, so an
    optimizer's constructor runs all of its argument checks (FusedAdam's AMSGrad refusal,
    CPU-Adam's create_adam) without compiling a kernel this host has no compiler cache for."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _engine(config):
    """A DeepSpeedEngine that holds only the config: its optimizer and scheduler methods read
    nothing else, so DeepSpeed's own _configure_basic_optimizer, _do_optimizer_sanity_check and
    _scheduler_from_config run here without a model."""
    from deepspeed.runtime.engine import DeepSpeedEngine
    engine = DeepSpeedEngine.__new__(DeepSpeedEngine)
    for name, value in {"_config": config, "client_optimizer": None, "global_rank": 0, "pipeline_parallelism": False,
                        "zenflow": False, "has_moe_layers": False}.items():
        object.__setattr__(engine, name, value)
    return engine


def _weights():
    """A matrix and a bias, each tagged as deepspeed.initialize tags a model's (Muon splits on it)."""
    import torch
    weights = [torch.nn.Parameter(torch.zeros(4, 4)), torch.nn.Parameter(torch.zeros(4))]
    for w in weights:
        w.use_muon = w.ndim >= 2
    return weights


def _basic_optimizer(engine):
    """The engine's basic optimizer, built by its own _configure_basic_optimizer with the op
    builders' load() swapped for _NoKernel (on the CPU accelerator FusedLamb's and FusedLion's
    builders are NotImplementedBuilder: a GPU host has them, and the config is what is judged).
    mup's optimizers fail as DeepSpeed fails without the package (it logs, then the name is
    unbound). No optimizer in the config: the client's, as Megatron-DeepSpeed passes its own,
    here torch's AdamW, which ZeRO has tested."""
    import torch
    from deepspeed.ops.op_builder.builder import OpBuilder
    from deepspeed.ops.op_builder.cpu.no_impl import NotImplementedBuilder
    if engine.optimizer_name() is None:
        return torch.optim.AdamW(_weights(), lr=1e-4)
    saved = {cls: cls.__dict__["load"] for cls in (OpBuilder, NotImplementedBuilder) if "load" in cls.__dict__}
    try:
        for cls in saved:
            cls.load = lambda self, verbose=False: _NoKernel()
        return engine._configure_basic_optimizer(_weights())
    finally:
        for cls, load in saved.items():
            cls.load = load


def _wrapped(engine, basic):
    """The optimizer deepspeed.initialize hands the schedule (engine.optimizer): the class
    _configure_optimizer wraps the basic one in, after _do_optimizer_sanity_check (ZeRO's
    untested-optimizer assertion, the dtype mixes it refuses). The wrapper is allocated, not
    constructed (its constructor partitions a model): what a schedule asks of it is its class
    (torch's schedules: is it a torch.optim.Optimizer?) and its .optimizer (DeepSpeed's unwrap it)."""
    from deepspeed.runtime import engine as ds_engine
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    kind = engine._do_optimizer_sanity_check(basic)
    if kind == ds_engine.ZERO_OPTIMIZATION:
        cls = DeepSpeedZeroOptimizer_Stage3 if engine.zero_optimization_stage() == 3 else ds_engine.DeepSpeedZeroOptimizer
    elif kind in (ds_engine.FP16, ds_engine.DDP_BFLOAT16):
        cls = ds_engine.FP16_Optimizer if isinstance(basic, ds_engine.FusedAdam) else ds_engine.FP16_UnfusedOptimizer
    elif kind == ds_engine.BFLOAT16:
        cls = ds_engine.BF16_Optimizer
    else:
        return basic
    wrapper = cls.__new__(cls)
    object.__setattr__(wrapper, "optimizer", basic)
    return wrapper


def _optimizer_and_scheduler(config):
    """deepspeed.initialize's _configure_optimizer then _configure_lr_scheduler, without a model."""
    engine = _engine(config)
    engine._scheduler_from_config(_wrapped(engine, _basic_optimizer(engine)))


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
        _optimizer_and_scheduler(config)
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
