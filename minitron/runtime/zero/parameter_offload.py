"""Stage 3's parameter side: the module hooks that gather a module's parameters before it runs
and release them after (DeepSpeed 0.19.8's ``DeepSpeedZeRoOffload``, ``zero/parameter_offload.py``,
with the gather itself in ``partition_parameters.py``). zero/stage3.py's optimizer inherits it.

    forward    pre-hook  gather the module's own parameters (and those registered with it)
               post-hook release them, and wrap the module's outputs in a function whose
                         *backward* gathers them again
    backward   that function runs before the module's backward nodes (it sits after them in
               the forward graph) and gathers; the optimizer's gradient hooks release them

What to gather ahead and what to keep is the coordinator's (partitioned_param_coordinator.py).
"""

from __future__ import annotations

import torch

from minitron.runtime.zero.leaf_modules import z3_leaf_module
from minitron.runtime.zero.partition_parameters import fetch

AVAILABLE, NOT_AVAILABLE = "AVAILABLE", "NOT_AVAILABLE"   # DeepSpeed's ZeroParamStatus


def register_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """``deepspeed.zero.register_external_parameter``: ``module`` uses ``parameter``, owned
    elsewhere, in its forward. Call it before ``initialize()``; stage 3 then gathers the
    parameter for ``module``'s forward and backward as it gathers the module's own."""
    external = module.__dict__.setdefault("ds_external_parameters", [])
    if not any(p is parameter for p in external):
        external.append(parameter)


def _params_of(module: torch.nn.Module) -> list:
    """What a module's forward needs gathered: its own parameters and the registered ones; a
    leaf module's descendants' too (leaf_modules.py)."""
    return list(module.parameters(recurse=z3_leaf_module(module))) + \
        list(getattr(module, "ds_external_parameters", []))


class _GatherBeforeBackward(torch.autograd.Function):
    """Identity in forward; in backward, gathers the module's parameters first."""

    @staticmethod
    def forward(ctx, optimizer, module, *outputs):
        ctx.optimizer, ctx.module = optimizer, module
        return tuple(t.view_as(t) for t in outputs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.optimizer._fetch(ctx.module)
        return (None, None, *grads)


class DeepSpeedZeRoOffload:
    """Needs from the optimizer: ``_group_of`` (the partitioned parameters), ``coordinator``,
    ``zeropp``, ``offload``, ``allgather_sequential``, ``all_reduce_fetch`` and the parameter
    swapping's ``param_swapper``, ``_swap_in``, ``_release_swapped`` (param_swap.py)."""

    def _install_hooks(self, module: torch.nn.Module) -> None:
        self._hooks = [module.register_forward_pre_hook(lambda *_: self.coordinator.reset_step())]
        # Every module, as DeepSpeed hooks every one: one without parameters gathers nothing, but
        # its forward and backward are steps of the coordinator's trace all the same. A leaf
        # module's descendants are not visited (DeepSpeed's _register_deepspeed_module).
        todo, count = [module], 0
        while todo:   # depth first, parents before children: module.modules()'s order
            m = todo.pop(0)
            m.ds_id, count = count, count + 1   # DeepSpeed's numbering; warnings name modules by it
            self._hooks += [m.register_forward_pre_hook(self._pre_forward), m.register_forward_hook(self._post_forward)]
            todo[:0] = [] if z3_leaf_module(m) else list(m.children())

    @torch.no_grad()
    def gather(self, params: list) -> None:
        """One all-gather for all of a module's missing parameters, as DeepSpeed coalesces them:
        my pieces end to end go out, every rank's come back as the rows of ``full``, and
        parameter p is its column range of the rows, read row after row."""
        todo = list({id(p): p for p in params if p in self._group_of and p.ds_status != AVAILABLE}.values())
        if self.param_swapper is not None:   # offload_param nvme: the swapped pieces from their files first
            self._swap_in(todo)
        for dtype in dict.fromkeys(p.ds_tensor.dtype for p in todo):   # one dtype per collective
            # partition_parameters.py: coalesced (zeropp.py: hpZ's secondary pieces, qwZ's int8),
            # one by one, or one all-reduce, as the config asks; host -> device first, offloaded
            fetch([p for p in todo if p.ds_tensor.dtype == dtype], self.zeropp,
                  lambda mine: self.offload.fetch(mine, None), self.allgather_sequential, self.all_reduce_fetch)
        self._release_swapped([p for p in todo if p.ds_persist])   # kept whole: no release will come

    def release(self, params: list) -> None:
        for p in params:
            if p in self._group_of:
                if p.ds_status == AVAILABLE:
                    self.zeropp.keep_secondary(p)   # hpZ: my 1/h of the whole, for the next gathers
                # on the device the parameter lives on (a swapped piece's, a meta stand-in between
                # reads: the host, as "cpu"); asked of the swapper, as a rank's own device may be meta
                p.data = torch.empty(0, dtype=p.ds_tensor.dtype,
                                     device=self.offload.host if p in self.params_swapped else p.ds_tensor.device)
                p.ds_status = NOT_AVAILABLE
        self._release_swapped(params)   # offload_param nvme: the pieces read for the gather go

    def _fetch(self, module) -> None:
        available = lambda: sum(p.ds_numel for p in self._group_of if p.ds_status == AVAILABLE)   # noqa: E731
        own = [p for p in _params_of(module) if p in self._group_of]
        self.coordinator.fetch_sub_module(module, own, self.gather, available)

    def _pre_forward(self, module, inputs):
        self._fetch(module)

    def _post_forward(self, module, inputs, output):
        # Wrap first, release second: a module may hand back one of its own parameters (a
        # linear with skip_bias_add returns its bias, added by the caller); the wrapper's view
        # of it keeps the gathered values that the caller still adds.
        output = self._wrap_outputs(module, output)
        self.release(self.coordinator.params_to_release(_params_of(module)))
        return output

    def _wrap_outputs(self, module, output):
        single = torch.is_tensor(output)
        items = [output] if single else list(output) if isinstance(output, (tuple, list)) else None
        if items is None:
            return output
        if torch.is_grad_enabled():
            slots = [k for k, t in enumerate(items) if torch.is_tensor(t) and t.requires_grad]
            if not slots:
                return output
            wrapped = _GatherBeforeBackward.apply(self, module, *(items[k] for k in slots))
            for k, t in zip(slots, wrapped):
                items[k] = t
        else:   # no backward to prepare for; a returned parameter still needs its values kept
            own = _params_of(module)
            items = [t.view_as(t) if any(t is p for p in own) else t for t in items]
        if single:
            return items[0]
        return type(output)(*items) if hasattr(output, "_fields") else type(output)(items)   # namedtuple
