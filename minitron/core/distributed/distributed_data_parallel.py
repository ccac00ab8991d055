"""DistributedDataParallel: replicas of the model that average their gradients every step.

Every DP rank holds the same weights and sees different samples. After backward, each rank's
gradient is the gradient of *its* samples' loss; the average over the ranks is the gradient of
the whole global batch. This wrapper owns that average:

* at construction, every parameter gets ``main_grad``, a view into a contiguous buffer
  (param_and_grad_buffer_layout.py), and a hook that moves each fresh ``param.grad`` into it;
* ``no_sync()`` lets gradient-accumulation micro-batches add up locally (in ``.grad``, moved
  into the buffer by the last micro-batch's hook), without talking;
* ``finish_grad_sync()`` (called by finalize_model_grads after the last micro-batch) runs the
  all-reduce, or the reduce-scatter when the distributed optimizer owns shards of the state;
  with ``overlap_grad_reduce`` the hooks have launched each bucket's already, and it waits;
* ``zero_grad_buffer()`` clears the buffer before the next step;
* with ``overlap_param_gather`` (ZeRO-1), forward pre-hooks wait for each bucket's parameter
  all-gather, launched one bucket ahead of the forward pass.

Unlike torch's DDP, ``forward`` itself starts nothing: Megatron's schedules and hooks decide
when each collective runs, and this class holds the buffers and the explicit entry points.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch

from minitron.core import parallel_state
from minitron.core.distributed.distributed_data_parallel_config import resolve_bucket_size
from minitron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer, partition_buckets
from minitron.core.transformer.module import MegatronModule
from minitron.trace import traced


class DistributedDataParallel(MegatronModule):
    """Wrap ``module`` (one model chunk); ``config`` is its TransformerConfig."""

    def __init__(self, config, ddp_config, module: torch.nn.Module, disable_bucketing: bool = False):
        super().__init__(config)
        self.module = module
        self.ddp_config = ddp_config
        self.dp_cp_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        dp_size = torch.distributed.get_world_size(group=self.dp_cp_group)

        # --8<-- [start:bucket-size]
        disable_bucketing = disable_bucketing or parallel_state.get_pipeline_model_parallel_rank() > 0
        bucket_size = resolve_bucket_size(ddp_config.bucket_size, ddp_config.overlap_grad_reduce,
                                          dp_size, disable_bucketing)
        self.bucket_size = bucket_size
        # --8<-- [end:bucket-size]

        # Averaging = summing the ranks' gradients and dividing by dp. With a per-token loss
        # the schedule divides by the global token count instead (finalize_model_grads).
        if getattr(config, "calculate_per_token_loss", False) or ddp_config.average_in_collective:
            gradient_scaling_factor = 1.0
        else:
            gradient_scaling_factor = 1.0 / dp_size

        # --8<-- [start:expert-buffers]
        # Dense parameters are replicated on every data-parallel (with context) rank; an expert
        # (allreduce=False, moe/experts.py) only on the ranks holding the same experts: the
        # expert-data-parallel group. Each kind gets buffers over its own group. The scale is
        # 1/dp for both: an expert's gradient summed over its expert-dp copies has seen the
        # tokens of all dp replicas (the all-to-all brought them), so it too is a sum of dp
        # replicas' gradients.
        params, expert_params, param_to_name = [], [], {}
        for name, param in self.module.named_parameters():
            if not param.requires_grad:
                continue
            (params if getattr(param, "allreduce", True) else expert_params).append(param)
            param_to_name[param] = name
        self.params_with_grad = params + expert_params
        self.buffers = self._make_buffers(params, self.dp_cp_group, bucket_size, param_to_name,
                                          gradient_scaling_factor)
        self.expert_parallel_buffers = []
        if expert_params:
            self.expt_dp_group = parallel_state.get_expert_data_parallel_group()
            self.expert_parallel_buffers = self._make_buffers(expert_params, self.expt_dp_group, bucket_size,
                                                              param_to_name, gradient_scaling_factor)
        dense_groups, expert_groups = partition_buckets(self.buffers), partition_buckets(self.expert_parallel_buffers)
        self.bucket_groups = dense_groups + expert_groups
        # --8<-- [end:expert-buffers]
        self.param_to_bucket_group = {p: g for g in self.bucket_groups for p in g.params}
        # The forward pass meets the buckets in reverse (they are laid out last layer first):
        # each bucket's all-gather, once waited for, launches the one the forward needs next.
        for groups in (dense_groups, expert_groups):
            for later, earlier in zip(groups[1:], groups[:-1]):
                later.next_param_gather_bucket_group = earlier

        # --8<-- [start:hook]
        # The hook fires after autograd has accumulated a parameter's gradient into .grad
        # (once per backward, even when the parameter is used twice, as a tied embedding is).
        # Megatron reaches the same moment by hooking the parameter's AccumulateGrad node.
        # Experts too: their buckets, like the dense ones, are launched from backward as soon
        # as their last gradient is in (over the expert-data-parallel group), not left to
        # finish_grad_sync.
        for param in self.params_with_grad:
            param.register_post_accumulate_grad_hook(self._make_backward_post_hook())
        # --8<-- [end:hook]
        self.remove_forward_pre_hook_handles = {}
        if ddp_config.overlap_param_gather:
            self.enable_forward_pre_hook()

    def _make_buffers(self, params, group, bucket_size, param_to_name, gradient_scaling_factor):
        """One buffer per (param dtype, grad dtype): a bf16 model with fp32 gradient reduction
        has one buffer of fp32 gradients; mixed dtypes would get one buffer each."""
        by_dtype: dict[tuple, list] = {}
        for param in params:
            # an fp8 parameter's gradient is in the dtype it stands for (--fp8-param-gather)
            grad_dtype = torch.float32 if self.ddp_config.grad_reduce_in_fp32 else \
                getattr(param, "fp8_nominal_dtype", param.dtype)
            by_dtype.setdefault((param.dtype, grad_dtype), []).append(param)
        return [_ParamAndGradBuffer(self.ddp_config, param_dtype, grad_dtype, group_params, group,
                                    bucket_size, param_to_name, gradient_scaling_factor)
                for (param_dtype, grad_dtype), group_params in by_dtype.items()]

    def _make_backward_post_hook(self):
        """The hook of every parameter. It holds this DDP weakly, and its parameter not at all
        (autograd passes it in): the parameter holds the hook, and this DDP holds the
        parameter (self.module), so a strong reference would close a cycle. A tensor's hooks
        are kept by torch's C++ side, where the cyclic collector cannot look, so that cycle was
        never freed, not even by gc.collect(): the DDP, its buffers and its data-parallel
        groups (gloo's threads) outlived pretrain. Megatron's hooks hold the DDP, and its
        process ends with the training; minitron's ranks may go on (tests, fake players)."""
        ddp_ref = weakref.ref(self)

        def hook(param):
            ddp = ddp_ref()
            if ddp is None:  # the DDP is gone, and the buffer this hook would fill with it
                return
            bucket_group = ddp.param_to_bucket_group[param]
            if getattr(param, "grad_added_to_main_grad", False):
                param.grad = None   # a placeholder: the fp8 layer added the gradient to main_grad (fp8/linear.py)
            if not bucket_group.is_last_microbatch:
                # Inside no_sync, leave the gradient to autograd: it adds each micro-batch
                # into .grad, as plain PyTorch does. Moving it every micro-batch frees a
                # model's worth of .grad each time, and glibc hands the freed heap back to the
                # OS only to fault it in again: 3-4x the page faults of a plain loop, measured.
                return
            if param.grad is not None:
                # Move the summed gradient into the buffer and free .grad: from here on
                # the buffer is the one copy.
                param.main_grad.add_(param.grad)
                param.grad = None
            if ddp.ddp_config.overlap_grad_reduce:
                bucket_group.register_grad_ready(param)
        return hook

    # --8<-- [start:forward-pre-hook]
    def enable_forward_pre_hook(self) -> None:
        """overlap_param_gather: before any submodule runs, its parameters must be gathered."""
        if self.remove_forward_pre_hook_handles:
            raise RuntimeError("the forward pre-hooks are enabled already")
        for module in self.module.modules():
            self.remove_forward_pre_hook_handles[module] = module.register_forward_pre_hook(
                self._make_forward_pre_hook())

    def _make_forward_pre_hook(self):
        # Weakly held, as the backward hook holds it: a module's hook holding this DDP would be
        # a cycle (DDP -> module -> hook -> DDP), freed only by the collector's next full pass.
        ddp_ref = weakref.ref(self)

        def hook(module, *unused):
            ddp = ddp_ref()
            if ddp is None:
                return
            # Only the module's own parameters: its children have hooks of their own.
            groups = dict.fromkeys(ddp.param_to_bucket_group[p] for p in module.parameters(recurse=False)
                                   if p in ddp.param_to_bucket_group)
            for bucket_group in groups:
                bucket_group.finish_param_sync()
        return hook
    # --8<-- [end:forward-pre-hook]

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    @contextmanager
    def no_sync(self):
        """Micro-batches run inside this only accumulate; the bucket collectives wait."""
        for bucket_group in self.bucket_groups:
            bucket_group.is_last_microbatch = False
        try:
            yield
        finally:
            for bucket_group in self.bucket_groups:
                bucket_group.is_last_microbatch = True

    def start_grad_sync(self, *unused) -> None:
        """Launch every bucket's reduction (asynchronous with overlap_grad_reduce)."""
        for bucket_group in self.bucket_groups:
            bucket_group.start_grad_sync()

    @traced(args=lambda self: {"buckets": len(self.bucket_groups),
                               "numel": sum(b.numel for b in self.buffers + self.expert_parallel_buffers)})
    def finish_grad_sync(self) -> None:
        """Make sure every bucket is reduced: run it now, or wait for the one in flight."""
        for param in self.params_with_grad:
            if param.grad is not None and param.grad is not param.main_grad:
                # Used in an earlier micro-batch but not in the last one: its hook never
                # moved the sum (with overlap, its bucket then reports it below).
                param.main_grad.add_(param.grad)
                param.grad = None
        for bucket_group in self.bucket_groups:
            bucket_group.finish_grad_sync()

    @traced(args=lambda self, *unused, force_sync=False: {"force_sync": force_sync})
    def start_param_sync(self, *unused, force_sync: bool = False) -> None:
        """Distributed optimizer: all-gather the updated parameter shards of every bucket.

        Synchronous, unless overlap_param_gather: then each bucket's all-gather is launched
        and waited for by the forward pre-hooks; ``force_sync`` gathers (or finishes) them now.
        """
        if not self.ddp_config.use_distributed_optimizer:
            raise RuntimeError("start_param_sync is for the distributed optimizer: "
                               "set DistributedDataParallelConfig.use_distributed_optimizer")
        for bucket_group in self.bucket_groups:
            bucket_group.start_param_sync(force_sync=force_sync)

    def scale_gradients(self, scaling_factor: float) -> None:
        for buffer in self.buffers + self.expert_parallel_buffers:
            buffer.scale_gradients(scaling_factor)

    def zero_grad_buffer(self) -> None:
        """Zero every gradient buffer and forget which gradients arrived: once per step."""
        for buffer in self.buffers + self.expert_parallel_buffers:
            buffer.reset()
        for bucket_group in self.bucket_groups:
            bucket_group.reset()

    @traced
    def broadcast_params(self) -> None:
        """Copy the DP source rank's weights to every replica, so all start identical."""
        src = parallel_state.get_data_parallel_src_rank(with_context_parallel=True)
        expert_src = parallel_state.get_global_ranks("expt-dp")[0]
        for param in self.module.parameters():
            if getattr(param, "allreduce", True):
                torch.distributed.broadcast(param.data, src=src, group=self.dp_cp_group)
            else:   # an expert: its replicas are the expert-data-parallel group
                torch.distributed.broadcast(param.data, src=expert_src, group=self.expt_dp_group)

    # The checkpoint holds the wrapped module's keys, without a "module." prefix.
    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True):
        return self.module.load_state_dict(state_dict, strict=strict)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        return self.module.sharded_state_dict(prefix, sharded_offsets, metadata)
