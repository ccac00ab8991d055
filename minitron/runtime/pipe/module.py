"""DeepSpeed's ``PipelineModule`` (``deepspeed/runtime/pipe/module.py``): a model written as a
list of layers, of which each stage builds only its own.

The constraint that makes this work: the forward pass is the list applied in order, each layer's
output the next one's input (a tuple of tensors may travel between layers). So the model can be
cut anywhere, and the cut points come from counting (partition.py), not from the model's code.
That is the difference to Megatron, whose GPTModel knows it is a pipeline stage
(``pre_process`` / ``post_process``) and builds its own share.

The list holds three kinds of entries:

    LayerSpec(cls, *args)            built only on the stage that owns it: a 96-layer model
                                     never exists whole on any rank
    TiedLayerSpec(key, cls, *args)   one module per key per stage, shared by every entry with
                                     that key: a GPT's embedding at the front and its output
                                     head at the back (``forward_fn`` uses the module's weight
                                     differently there). Two stages then hold copies of one
                                     weight; they start equal (broadcast) and stay equal
                                     because their gradients are summed over the tie group
                                     (``allreduce_tied_weight_gradients``, ReduceTiedGrads)
    a module or a function           used as it is
"""

from __future__ import annotations

import re
from functools import partial

import torch
from torch import nn

from minitron import comm as dist   # as DeepSpeed's: from deepspeed import comm as dist
from minitron.accelerator import get_accelerator
from minitron.runtime.activation_checkpointing import checkpointing
from minitron.runtime.pipe.partition import partition_balanced, partition_uniform
from minitron.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid


class PipelineError(Exception):
    """A PipelineModule that cannot be built as asked."""


class LayerSpec:
    """A layer not yet built: its class and arguments."""

    def __init__(self, typename, *module_args, **module_kwargs):
        if not (isinstance(typename, type) and issubclass(typename, nn.Module)):
            raise RuntimeError("LayerSpec only supports torch.nn.Module types")
        self.typename, self.module_args, self.module_kwargs = typename, module_args, module_kwargs

    def __repr__(self) -> str:
        return f"{self.typename.__name__}(...)"

    def build(self) -> nn.Module:
        return self.typename(*self.module_args, **self.module_kwargs)


class TiedLayerSpec(LayerSpec):
    """A layer whose weights (``tied_weight_attr``) are shared with every other entry of ``key``."""

    def __init__(self, key, typename, *module_args, forward_fn=None, tied_weight_attr=("weight",), **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key, self.forward_fn = key, forward_fn
        self.tied_weight_attr = [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)


def _trainable(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


class PipelineModule(nn.Module):
    def __init__(self, layers, num_stages: int | None = None, topology=None, loss_fn=None,
                 partition_method: str = "parameters", activation_checkpoint_interval: int = 0,
                 activation_checkpoint_func=None, checkpointable_layers: list[str] | None = None):
        super().__init__()
        # Activations of every ``interval`` layers recomputed in backward (0: none); the ds_config's
        # pipeline.activation_checkpoint_interval overrides it when the engine is built, as in DeepSpeed
        self.activation_checkpoint_interval = activation_checkpoint_interval
        self.activation_checkpoint_func = activation_checkpoint_func or checkpointing.checkpoint
        self.checkpointable_layers = checkpointable_layers
        if num_stages is None and topology is None:
            raise RuntimeError("must provide num_stages or topology")
        self.loss_fn = loss_fn
        self.world_group = dist.new_group(ranks=list(range(dist.get_world_size())))
        self.global_rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if topology is None:
            if self.world_size % num_stages:
                raise RuntimeError(f"num_stages ({num_stages}) must divide distributed world size ({self.world_size})")
            topology = PipeDataParallelTopology(num_pp=num_stages, num_dp=self.world_size // num_stages)
        self._topo = topology
        self.num_stages = topology.get_dim("pipe")
        self._grid = PipelineParallelGrid(topology)
        self.stage_id = self._grid.get_stage_id()
        self._layer_specs = list(layers)
        self._num_layers = len(self._layer_specs)
        self.parts = self._partition_layers(partition_method)
        self._local_start, self._local_stop = self.parts[self.stage_id], self.parts[self.stage_id + 1]
        self.forward_funcs, self.tied_modules, self.tied_weight_attrs = [], nn.ModuleDict(), {}
        self._build()
        # On this rank's device before the tied copies are broadcast: nccl moves device tensors only.
        self.to(get_accelerator().current_device_name())
        self.tied_comms = self._index_tied_modules()
        self._synchronize_tied_weights()

    # --- building this stage ----------------------------------------------------------------

    def _build(self) -> None:
        for layer_idx in range(self._local_start, self._local_stop):
            layer = self._layer_specs[layer_idx]
            if isinstance(layer, TiedLayerSpec):
                if layer.key not in self.tied_modules:   # the first entry of a key builds it
                    self.tied_modules[layer.key] = layer.build()
                    self.tied_weight_attrs[layer.key] = layer.tied_weight_attr
                module = self.tied_modules[layer.key]
                self.forward_funcs.append(module if layer.forward_fn is None else partial(layer.forward_fn, module))
            elif isinstance(layer, (LayerSpec, nn.Module)):
                module = layer.build() if isinstance(layer, LayerSpec) else layer
                self.forward_funcs.append(module)
                self.add_module(str(layer_idx), module)   # named by its global index, as in DeepSpeed
            else:   # a plain function (a reshape, a lambda): no weights
                self.forward_funcs.append(layer)

    def _count_layer_params(self) -> list[int]:
        """Each entry's trainable parameters. A spec is built to be counted (one at a time, then
        dropped), which is why DeepSpeed's default method costs a pass over the model."""
        counts = []
        for layer in self._layer_specs:
            if isinstance(layer, LayerSpec):
                counts.append(_trainable(layer.build()))
            else:
                counts.append(_trainable(layer) if isinstance(layer, nn.Module) else 0)
        return counts

    def _find_layer_type(self, pattern: str) -> list[int]:
        regex, found = re.compile(pattern, re.IGNORECASE), []
        for idx, layer in enumerate(self._layer_specs):
            name = layer.typename.__name__ if isinstance(layer, LayerSpec) else (
                type(layer).__name__ if isinstance(layer, nn.Module) else getattr(layer, "__name__", None))
            if name is not None and regex.search(name):
                found.append(idx)
        if not found:
            raise RuntimeError(f"Partitioning '{pattern}' found no valid layers to partition.")
        return found

    def _partition_layers(self, method: str) -> list[int]:
        method = method.lower()
        if method == "uniform":
            return partition_uniform(self._num_layers, self.num_stages)
        if method == "parameters":
            return partition_balanced(self._count_layer_params(), self.num_stages)
        if method.startswith("type:"):
            matching = set(self._find_layer_type(method.split(":", 1)[1]))
            return partition_balanced([int(i in matching) for i in range(self._num_layers)], self.num_stages)
        raise NotImplementedError(f"Partitioning method {method} not implemented.")

    def forward(self, forward_input):
        def run(funcs):
            def chunk(*inputs):
                x = inputs[0] if len(inputs) == 1 else inputs   # a lone tensor travels unwrapped
                for layer in funcs:
                    x = layer(x)
                return x
            return chunk

        interval = self.activation_checkpoint_interval
        if interval <= 0:
            return run(self.forward_funcs)(forward_input)
        x = forward_input
        for start in range(0, len(self.forward_funcs), interval):
            funcs = self.forward_funcs[start:start + interval]
            x = x if isinstance(x, tuple) else (x,)
            x = self.activation_checkpoint_func(run(funcs), *x) if self._is_checkpointable(funcs) else run(funcs)(*x)
        return x

    def _is_checkpointable(self, funcs) -> bool:
        """DeepSpeed's rule: the listed layer classes only, if the module lists any; else any chunk
        holding parameters (a chunk of functions alone has nothing worth recomputing)."""
        if self.checkpointable_layers is not None:
            return all(f.__class__.__name__ in self.checkpointable_layers for f in funcs)
        return any(any(True for _ in f.parameters()) for f in funcs if isinstance(f, nn.Module))

    # --- tied weights -------------------------------------------------------------------------

    def stage_owner(self, layer_idx: int) -> int:
        for stage in range(self.num_stages):
            if self.parts[stage] <= layer_idx < self.parts[stage + 1]:
                return stage
        raise RuntimeError(f"Layer {layer_idx} not owned? parts={self.parts}")

    def _index_tied_modules(self) -> dict:
        """For every key, a group per pipeline (data and model coordinate): the ranks of that
        pipeline whose stage holds a copy. Every rank creates every group, in sorted key order,
        since new_group is collective. A copy on any rank but the group's first is marked
        ``ds_pipe_replicated``, so a gradient norm counts the weight once."""
        tied_comms = {}
        if self.num_stages == 1:
            return tied_comms
        for key in sorted({s.key for s in self._layer_specs if isinstance(s, TiedLayerSpec)}):
            stages = sorted({self.stage_owner(i) for i, s in enumerate(self._layer_specs)
                             if isinstance(s, TiedLayerSpec) and s.key == key})
            for dp in range(self._grid.data_parallel_size):
                for mp in range(self._grid.get_slice_parallel_world_size()):
                    extra = {"model": mp} if self._grid.get_slice_parallel_world_size() > 1 else {}
                    ranks = [self._grid.stage_to_global(stage_id=s, data=dp, **extra) for s in stages]
                    group = dist.new_group(ranks=ranks)
                    if self.global_rank in ranks:
                        tied_comms[key] = {"ranks": ranks, "group": group, "weight_attr": self.tied_weight_attrs[key],
                                           "module": self.tied_modules[key]}
                        if self.global_rank != ranks[0]:
                            for p in self.tied_modules[key].parameters():
                                p.ds_pipe_replicated = True
        return tied_comms

    @staticmethod
    def _recursive_getattr(module: nn.Module, attr_name: str) -> torch.Tensor:
        for item in attr_name.split("."):
            module = getattr(module, item)
        return module

    def get_tied_weights_and_groups(self) -> list:
        return [(self._recursive_getattr(self.tied_modules[key], attr), comm["group"])
                for key, comm in self.tied_comms.items() for attr in comm["weight_attr"]]

    def allreduce_tied_weight_gradients(self) -> None:
        """Sum each tied weight's gradient over its copies: every copy then holds the gradient
        of the one shared weight, and the same optimizer step keeps the copies equal."""
        for weight, group in self.get_tied_weights_and_groups():
            if weight.grad is not None:
                dist.all_reduce(weight.grad, group=group)

    def _synchronize_tied_weights(self) -> None:
        for key, comm in self.tied_comms.items():
            for attr in comm["weight_attr"]:
                dist.broadcast(self._recursive_getattr(comm["module"], attr).data, src=min(comm["ranks"]),
                               group=comm["group"])

    # --- what the engine asks ---------------------------------------------------------------------

    def partitions(self) -> list[int]:
        return self.parts

    def topology(self):
        return self._topo

    def mpu(self) -> PipelineParallelGrid:
        return self._grid

    def num_pipeline_stages(self) -> int:
        return self.num_stages
