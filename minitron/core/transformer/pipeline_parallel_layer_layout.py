"""Megatron's room for the pipeline layer layout (megatron/core/transformer/
pipeline_parallel_layer_layout.py). The code is in minitron/core/pipeline_parallel/layer_layout.py:
validate_args and the memory estimate read it without importing torch, which importing anything
under minitron.core.transformer would do (its __init__ loads the config, which needs torch)."""

from minitron.core.pipeline_parallel.layer_layout import (  # noqa: F401  (the model's side imports these here)
    config_split_problem, counts_from, layer_counts, layout_problem, parse_layout, split_problem, stage_layers,
)
