"""The ds_config's ``pipeline`` section (DeepSpeed 0.19.8's get_pipeline_config in
runtime/config.py, read by its PipelineEngine.__init__; minitron/runtime/pipe/engine.py here).

DeepSpeed merges the section over its defaults key by key and checks nothing until the
PipelineEngine is built. What that engine reads:
- activation_checkpoint_interval: above 0 it overrides the PipelineModule's own, so the stage's
  forward runs in chunks of that many layers, each chunk with parameters through
  deepspeed.checkpointing.checkpoint, and the first stage's inputs are made to require grad
  (the reentrant checkpoint needs an input that does);
- use_reentrant (a key outside the defaults): false swaps in DeepSpeed's non_reentrant_checkpoint;
- pipe_partitioned, grad_partitioned: asserted to be bools; with a model axis in the grid they cut
  the activations (and their gradients) sent between stages into model-parallel pieces.
The others, stages, partition and seed_layers, no engine reads: PipelineModule takes its stage
count, partition method and seed_layers as constructor arguments from the script (NO_EFFECT).
"""

from __future__ import annotations

from minitron.runtime.config_values import DeepSpeedConfigError, check_keys, json_value

PIPELINE_DEFAULTS = {"stages": "auto", "partition": "best", "seed_layers": False, "activation_checkpoint_interval": 0,
                     "pipe_partitioned": True, "grad_partitioned": True}   # DeepSpeed's default_pipeline
NO_EFFECT = {
    "pipeline.stages": "read by no DeepSpeed code: the stage count is PipelineModule(num_stages=...) in the "
                       "script, in DeepSpeed and in minitron alike",
    "pipeline.partition": "read by no DeepSpeed code: the layer split is PipelineModule(partition_method=...) "
                          "in the script, in DeepSpeed and in minitron alike",
    "pipeline.seed_layers": "read by no DeepSpeed code: per-layer seeding is PipelineModule(seed_layers=...) "
                            "in the script, not the config",
}


def parse_pipeline(params: dict) -> dict:
    section = params.get("pipeline", {})
    if not isinstance(section, dict):
        raise DeepSpeedConfigError(f"pipeline must be an object, got {json_value(section)}")
    # Unknown keys: DeepSpeed merges them silently; minitron names them, as for every section
    check_keys(section, tuple(PIPELINE_DEFAULTS) + ("use_reentrant",), {}, "pipeline")
    config = {**PIPELINE_DEFAULTS, "use_reentrant": True, **section}
    for key in ("pipe_partitioned", "grad_partitioned"):   # PipelineEngine's isinstance(..., bool) asserts
        if not isinstance(config[key], bool):
            raise DeepSpeedConfigError(f"pipeline.{key} must be true or false, got {json_value(config[key])}")
    interval = config["activation_checkpoint_interval"]
    if isinstance(interval, bool) or not isinstance(interval, int):   # DeepSpeed compares it with 0
        raise DeepSpeedConfigError(f"pipeline.activation_checkpoint_interval must be a whole number of layers "
                                   f"(0: no checkpointing), got {json_value(interval)}")
    if config["use_reentrant"] is False:
        raise DeepSpeedConfigError("pipeline.use_reentrant false asks for DeepSpeed's non_reentrant_checkpoint, "
                                   "which minitron does not build; remove it (the reentrant checkpoint is the default)")
    if config["use_reentrant"] is None:   # DeepSpeed's engine reads null as its default
        config["use_reentrant"] = True
    return config
