"""DeepSpeed's runtime, small: the ds_config and its batch triad (config.py, config_sections.py),
and ``initialize()`` (here, as DeepSpeed's is in ``deepspeed/__init__.py``) with the engine and
ZeRO stages 0-3 (engine.py, zero/).

Importing this package does not import torch: ``minitron ds-config`` resolves a config before any
process (or torch) starts.
"""

from minitron.runtime.config import DeepSpeedConfig, resolve_batch_triad  # noqa: F401
from minitron.runtime.config_sections import DeepSpeedConfigError  # noqa: F401


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, mpu=None, dist_init_required=None, collate_fn=None, config=None,
               config_params=None):
    """``deepspeed.initialize`` (``deepspeed/__init__.py``): returns ``(engine, optimizer,
    training_dataloader, lr_scheduler)``, as DeepSpeed does.

    ``optimizer``/``lr_scheduler`` may be objects or callables (DeepSpeed accepts both); when
    absent they come from the config. ``training_dataloader`` is None unless ``training_data``
    (a Dataset) is given. ``mpu`` is a model-parallel unit such as Megatron's parallel_state. A
    PipelineModule gets the PipelineEngine (runtime/pipe/engine.py), and its own grid as the mpu,
    as in DeepSpeed; any other model the DeepSpeedEngine (runtime/engine.py).

    The engines need torch, which this package must not import when it is only asked to resolve
    a config, so their imports wait for the first call.
    """
    # Lazy: torch comes with the comm layer and the engines (see the docstring).
    from minitron import comm as dist   # as DeepSpeed's: from deepspeed import comm as dist
    from minitron.runtime.engine import DeepSpeedEngine
    from minitron.runtime.pipe import PipelineEngine, PipelineModule

    if model is None:
        raise ValueError("initialize() needs a model")
    engine_class = DeepSpeedEngine
    if isinstance(model, PipelineModule):
        if mpu is not None:
            raise ValueError("initialize() with a PipelineModule takes no mpu: the module's topology is it")
        engine_class, mpu = PipelineEngine, model.mpu()
    dist.init_distributed(dist_init_required=dist_init_required)   # from the environment, if not yet
    config = config if config is not None else config_params
    if config is None and getattr(args, "deepspeed_config", None) is not None:
        config = args.deepspeed_config
    if config is None:
        raise ValueError("initialize() needs a ds_config: pass config= (a dict or a JSON path) "
                         "or args.deepspeed_config")
    engine = engine_class(model, optimizer, model_parameters, training_data, lr_scheduler, mpu, collate_fn,
                          DeepSpeedConfig(config, mpu))
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler
