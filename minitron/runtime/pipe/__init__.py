"""DeepSpeed's pipeline parallelism (``deepspeed/runtime/pipe/``): the model as a list of layers
cut into stages (module.py, partition.py), the ranks as a grid of named axes (topology.py), a
batch as a stream of instructions per stage (schedule.py), and the engine that executes the
stream over point-to-point sends (engine.py, p2p.py)."""

from minitron.runtime.pipe.engine import PipelineEngine  # noqa: F401
from minitron.runtime.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec  # noqa: F401
from minitron.runtime.pipe.topology import (  # noqa: F401
    PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology,
)
