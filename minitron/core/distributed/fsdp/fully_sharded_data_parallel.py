"""FullyShardedDataParallel: Megatron-FSDP's wrapper around one model chunk.

It answers the schedule and finalize_model_grads as DistributedDataParallel does (no_sync,
finish_grad_sync, zero_grad_buffer, scale_gradients), but its gradients and parameters live
in per-unit flat buffers (unit.py), and with ``optim_grads_params`` the parameters exist
whole only while their unit runs:

    forward pre-hook     gather the unit (all-gather of its shards)
    forward post-hook    free it; hook its outputs, whose gradient arrives just before the
                         unit's backward begins: that hook gathers it again
    gradient hooks       when the unit's last parameter has its gradient, reduce-scatter them
                         into each rank's shard and free the unit

So at any moment a rank holds its shards plus the one or two units that run. The units are
Megatron-FSDP's buckets (its _get_parameter_groups): with ``optim_grads_params`` each transformer
layer (Megatron's default ``fsdp_unit_modules``) and the rest of the chunk (embedding, final
norm, output layer); with ``no_shard``, ``optim`` and ``optim_grads`` there are no unit modules,
and the whole chunk is one bucket per kind of parameter, cut at DDP's bucket size only with
--overlap-grad-reduce: a small model reduces its gradients in one collective, as Megatron does.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch

from minitron.core import parallel_state
from minitron.core.distributed.distributed_data_parallel_config import resolve_bucket_size
from minitron.core.distributed.fsdp.buffer_index import parameter_buckets
from minitron.core.distributed.fsdp.finalize import sum_partial_pieces_over_tp, sum_tied_embedding_pieces_over_stages
from minitron.core.distributed.fsdp.meta_init import MetaMaterializer
from minitron.core.distributed.fsdp.unit import FSDPUnit
from minitron.core.fp8.param_gather import is_fp8_param
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.transformer_layer import TransformerLayer
from minitron.trace import traced


# Megatron's names for the dtypes of --megatron-fsdp-*-dtype; auto: decided by the rule where used
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "auto": None}


def _tensors(output):
    """The tensors in a module's output (a tensor, or nested tuples/lists/dicts of them)."""
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (tuple, list)):
        for item in output:
            yield from _tensors(item)
    elif isinstance(output, dict):
        for item in output.values():
            yield from _tensors(item)


class FullyShardedDataParallel(MegatronModule):
    """Wrap ``module`` (one model chunk); ``strategy`` is --data-parallel-sharding-strategy."""

    def __init__(self, config, module: torch.nn.Module, strategy: str, broadcast_from_src: bool = False,
                 grad_reduce_in_fp32: bool = False, rebuild=None, main_params_dtype: str = "fp32",
                 main_grads_dtype: str = "auto", grad_comm_dtype: str = "auto", bucket_size: int | None = None,
                 overlap_grad_reduce: bool = False, disable_bucketing: bool = False):
        super().__init__(config)
        self.module = module
        self.strategy = strategy
        self.dp_cp_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        dp = torch.distributed.get_world_size(group=self.dp_cp_group)
        # An MoE layer's experts (allreduce=False, moe/experts.py) are replicated only over the
        # expert-data-parallel group, the ranks holding the same experts: a unit of their own
        # is sharded over that group (Megatron-FSDP's expert mesh), as DDP gives them buffers of
        # their own. The scale is 1/dp for both, as DDP's.
        expert_group = parallel_state.get_expert_data_parallel_group() \
            if any(not getattr(p, "allreduce", True) for p in module.parameters()) else None
        # With pipeline stages the tied embedding lives on the first and the last stage, and the
        # two copies' gradients are summed piece by piece (finish_grad_sync): a unit of its own
        # gives it the same shards on both stages (Megatron gives it a bucket of its own too).
        tied = self._tied_embedding(module)
        # DDP's bucket size (a first chunk of the first stage, with --overlap-grad-reduce; else None)
        bucket_size = resolve_bucket_size(bucket_size, overlap_grad_reduce, dp, disable_bucketing or
                                          parallel_state.get_pipeline_model_parallel_rank() > 0)
        taken: set = {tied} if tied is not None else set()
        plan = []   # (unit name, the module whose forward gathers it, its parameters, its group)
        if strategy == "optim_grads_params":
            # Each layer's parameters, then the rest: Megatron's default fsdp_unit_modules are the
            # layers, gathered one at a time (mcore_fsdp_adapter.py)
            for name, m in module.named_modules():
                if not isinstance(m, TransformerLayer):
                    continue
                params = [p for p in m.parameters() if p.requires_grad and p not in taken]
                taken.update(params)
                plan.append((name, m, [p for p in params if getattr(p, "allreduce", True)], self.dp_cp_group))
                plan.append((name + " (experts)", m, [p for p in params if not getattr(p, "allreduce", True)],
                             expert_group))
        # The rest, and with the other strategies everything: Megatron has no unit modules there
        # (nothing is gathered per layer), so parameters go into buckets as DDP's do, by kind
        # (dense or expert, fp8 or not) and up to bucket_size elements (buffer_index.py).
        rest = [p for p in module.parameters() if p.requires_grad and p not in taken]
        kinds = [(getattr(p, "allreduce", True), is_fp8_param(p)) for p in rest]
        buckets = parameter_buckets(kinds, [p.numel() for p in rest], bucket_size)
        for n, ((dense, fp8), members) in enumerate(buckets):
            # "(rest)", or "(rest 0)", "(rest 1)", ... where a kind fills several buckets
            name = "(rest)" + (f" {n}" if sum(key == (dense, fp8) for key, _ in buckets) > 1 else "")
            plan.append((name if dense else name + " (experts)", module, [rest[i] for i in members],
                         self.dp_cp_group if dense else expert_group))
        if tied is not None:
            plan.append(("(tied embedding)", module, [tied], self.dp_cp_group))
        # --fp8-param-gather: a unit's fp8 weights get a unit of their own beside it, gathered by
        # the same module's hooks, as Megatron-FSDP keeps one buffer per dtype (unit.py).
        plan = [(name + " (fp8)" if fp8 else name, m, [p for p in params if is_fp8_param(p) == fp8], group)
                for name, m, params, group in plan for fp8 in (False, True)]
        plan = [entry for entry in plan if entry[2]]
        # Gradients are pre-scaled by 1/dp and summed, as DDP does (the same rounding).
        scale = 1.0 / dp
        # --megatron-fsdp-main-grads-dtype, or by default DDP's rule: fp32 with
        # --accumulate-allreduce-grads-in-fp32, else the parameters' own dtype (None)
        grad_dtype = DTYPES[main_grads_dtype] or (torch.float32 if grad_reduce_in_fp32 else None)
        comm_dtype = DTYPES[grad_comm_dtype]   # None: the gradients' dtype
        self.main_params_dtype = DTYPES[main_params_dtype]   # the optimizer's (fsdp_optimizer.py); None: the model's
        # --init-model-with-meta-device: each unit is built for real just before it is sharded
        # (meta_init.py), so one unit at a time exists whole.
        meta = MetaMaterializer(module, rebuild) if any(p.is_meta for p in module.parameters()) else None
        if meta is not None and rebuild is None:
            raise ValueError("a model built on the meta device needs rebuild (model_setup._chunk_builder) "
                             "to build its units for real")
        self.units = []
        for name, m, params, group in plan:
            if meta is not None:
                params = meta.real(params, meta.keep_for(m))
            if broadcast_from_src:   # --data-parallel-random-init: rank 0's draw becomes everyone's
                dense = group is self.dp_cp_group
                src = parallel_state.get_data_parallel_src_rank(with_context_parallel=True) if dense \
                    else parallel_state.get_global_ranks("expt-dp")[0]
                for p in params:
                    torch.distributed.broadcast(p.data, src=src, group=group)
            self.units.append(FSDPUnit(name, params, strategy, group, scale, grad_dtype, comm_dtype))
        if meta is not None:
            meta.done()
        self.unit_of = {p: unit for unit in self.units for p in unit.params}
        self._handles = []
        ref = weakref.ref(self)   # hooks hold the wrapper weakly (see DistributedDataParallel's hook)
        for (_, m, _, _), unit in zip(plan, self.units):
            self._handles.append(m.register_forward_pre_hook(self._pre_forward(unit)))
            self._handles.append(m.register_forward_hook(self._post_forward(unit)))
        for p in self.unit_of:
            self._handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(ref)))

    @staticmethod
    def _tied_embedding(module):
        """The stage's copy of a tied embedding that another stage holds too, or None."""
        if parallel_state.get_pipeline_model_parallel_world_size() == 1 or \
                not parallel_state.is_rank_in_embedding_group(ignore_virtual=True):
            return None
        inner = module
        while not hasattr(inner, "shared_embedding_or_output_weight") and hasattr(inner, "module"):
            inner = inner.module
        if not getattr(inner, "share_embeddings_and_output_weights", False):
            return None
        weight = inner.shared_embedding_or_output_weight()
        return weight if weight is not None and weight.requires_grad else None

    # --- hooks -------------------------------------------------------------------------------
    @staticmethod
    def _grad_hook(ref):
        def hook(param):
            fsdp = ref()
            if fsdp is not None:
                fsdp.unit_of[param].grad_ready(param)
        return hook

    @staticmethod
    def _pre_forward(unit):
        def hook(module, *unused):
            unit.gather()
        return hook

    # --8<-- [start:post-forward]
    @staticmethod
    def _post_forward(unit):
        def before_backward(grad):
            unit.in_backward = True
            unit.gather()
            unit.open_main_grads()
            return grad

        def hook(module, args, output):
            if not unit.in_backward:   # a forward recomputed inside backward keeps its gathered unit
                unit.free()
            if torch.is_grad_enabled():
                for t in _tensors(output):
                    if t.requires_grad:
                        t.register_hook(before_backward)
            return output
        return hook
    # --8<-- [end:post-forward]

    # --- DDP's interface ----------------------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    @contextmanager
    def no_sync(self):
        """Whole gradients (no_shard, optim) add up in grad_flat until finish_grad_sync; sharded
        ones are reduce-scattered every micro-batch anyway, since no rank keeps a whole one."""
        yield

    @traced(args=lambda self: {"strategy": self.strategy, "units": len(self.units)})
    def finish_grad_sync(self) -> None:
        """Reduce over dp what is still whole; then finalize_model_grads' other two sums, which
        find no whole gradient here (each rank keeps pieces), done on the pieces (finalize.py)."""
        for unit in self.units:
            unit.finish_grad_sync()
        sum_partial_pieces_over_tp(self)
        sum_tied_embedding_pieces_over_stages(self)

    def scale_gradients(self, scaling_factor: float) -> None:
        for unit in self.units:
            unit.grad_shard.mul_(scaling_factor)

    def zero_grad_buffer(self) -> None:
        for unit in self.units:
            unit.zero_grad()

    @traced(args=lambda self: {"strategy": self.strategy})
    def sync_params_after_step(self) -> None:
        for unit in self.units:
            unit.sync_params_after_step()

    def start_param_sync(self, *unused, force_sync: bool = False) -> None:
        """--overlap-param-gather's entry point (force_param_sync): nothing waits here."""

    def bytes_held(self) -> dict:
        held = [unit.bytes_held() for unit in self.units]
        return {key: sum(h[key] for h in held) for key in ("params", "grads")}

    @contextmanager
    def gathered(self):
        """Every unit whole for the length of the block (a weight hash, a look at the weights)."""
        for unit in self.units:
            unit.gather()
        try:
            yield
        finally:
            for unit in self.units:
                unit.free()

    def state_dict(self, *args, **kwargs):
        with self.gathered():
            return {k: v.clone() for k, v in self.module.state_dict(*args, **kwargs).items()}
