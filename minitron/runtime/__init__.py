"""DeepSpeed's runtime, small: the ds_config and its batch triad (config.py, config_sections.py),
and ``initialize()`` with the engine and ZeRO stages 0-3 (engine.py, zero/).

Importing this package does not import torch: ``minitron ds-config`` resolves a config before any
process (or torch) starts.
"""

from minitron.runtime.config import DeepSpeedConfig, resolve_batch_triad  # noqa: F401
from minitron.runtime.config_sections import DeepSpeedConfigError  # noqa: F401


def initialize(*args, **kwargs):
    """``deepspeed.initialize``: see minitron/runtime/engine.py. The engine needs torch, which
    this package must not import when it is only asked to resolve a config, so the import waits
    for the first call."""
    # Lazy: torch comes with the engine (see the docstring).
    from minitron.runtime.engine import initialize as _initialize
    return _initialize(*args, **kwargs)
