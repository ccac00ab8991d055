"""DeepSpeed's runtime, small: the ds_config and its batch triad (config.py, config_sections.py).

Importing this package does not import torch: ``minitron ds-config`` resolves a config before any
process (or torch) starts.
"""

from minitron.runtime.config import DeepSpeedConfig, resolve_batch_triad  # noqa: F401
from minitron.runtime.config_sections import DeepSpeedConfigError  # noqa: F401
