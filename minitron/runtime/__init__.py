"""DeepSpeed's runtime, small: the ds_config and its batch triad (config.py, config_sections.py),
and ``initialize()`` with the engine and ZeRO stages 0-3 (engine.py, zero/).

Importing this package does not import torch: ``minitron ds-config`` resolves a config before any
process (or torch) starts.
"""

from minitron.runtime.config import DeepSpeedConfig, resolve_batch_triad  # noqa: F401
from minitron.runtime.config_sections import DeepSpeedConfigError  # noqa: F401


def initialize(*args, model=None, mpu=None, **kwargs):
    """``deepspeed.initialize``: see minitron/runtime/engine.py. The engine needs torch, which
    this package must not import when it is only asked to resolve a config, so the import waits
    for the first call. A PipelineModule gets the PipelineEngine (runtime/pipe/engine.py), and
    its own grid as the mpu, as in DeepSpeed."""
    # Lazy: torch comes with the engines (see the docstring).
    from minitron.runtime.engine import initialize as _initialize
    from minitron.runtime.pipe import PipelineEngine, PipelineModule

    if isinstance(model, PipelineModule):
        if mpu is not None:
            raise ValueError("initialize() with a PipelineModule takes no mpu: the module's topology is it")
        return _initialize(*args, model=model, mpu=model.mpu(), engine_class=PipelineEngine, **kwargs)
    return _initialize(*args, model=model, mpu=mpu, **kwargs)
