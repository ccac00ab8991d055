"""DistributedOptimizer: ZeRO stage 1 over the data-parallel group.

With plain data parallelism every DP rank keeps the full optimizer state (Adam: two fp32
moments, plus fp32 main params for a 16-bit model: 12 bytes per parameter) and performs the
full, identical update. Redundant: the update of a weight depends only on that weight's own
gradient and state. So split the work:

    grads: reduce-scatter   rank r receives the DP-summed gradient of *its* shard only
    step:  rank r updates   its shard of the fp32 main params, with its shard of the state
    params: all-gather      every rank gets every updated shard back

A reduce-scatter followed by an all-gather moves the same bytes as one all-reduce, so the
communication is unchanged while the optimizer memory per rank drops by a factor dp.

The shards are the equal slices of each gradient bucket (param_and_grad_buffer_layout.py). A shard
boundary can fall inside a parameter, so a rank may own just part of a weight: the optimizer
works on flat slices, ``param.view(-1)[start:end]``, never on whole tensors.
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state
from minitron.core.fp8.param_gather import dequantized_shard, is_fp8_param, quantize_param_shard, take_init_val
from minitron.core.optimizer.optimizer import (
    _FLOAT16, MixedPrecisionOptimizer, _zero_grad_group_helper, copy_model_parallel_attributes,
)


class DistributedOptimizer(MixedPrecisionOptimizer):
    """``per_model_buffers``: {chunk index: that DDP chunk's buffers}; the chunks must be DDP
    wrappers built with ``use_distributed_optimizer=True`` (their grads are reduce-scattered)."""

    def __init__(self, optimizer, config, grad_scaler, model_chunks, per_model_buffers,
                 data_parallel_group):
        super().__init__(optimizer, config, grad_scaler)
        self.model_chunks = model_chunks
        self.buffers = [buffer for buffers in per_model_buffers.values() for buffer in buffers]
        # Experts (MoE) have buffers of their own, sharded over the expert-data-parallel group
        # (Megatron builds a second DistributedOptimizer for them; one that reads each buffer's
        # own group does the same work).
        self.buffers += [buffer for chunk in model_chunks for buffer in getattr(chunk, "expert_parallel_buffers", [])]
        if any(not buffer.ddp_config.use_distributed_optimizer for buffer in self.buffers):
            raise ValueError("the DistributedOptimizer needs DDP built with use_distributed_optimizer=True")
        self.data_parallel_group = data_parallel_group
        self.data_parallel_rank = torch.distributed.get_rank(group=data_parallel_group)
        self.data_parallel_world_size = torch.distributed.get_world_size(group=data_parallel_group)
        self.param_range_map = self._build_model_param_range_map()
        self._replace_params_by_shards()

    def _build_model_param_range_map(self) -> dict:
        """param -> (start, end): the part of param.view(-1) inside this rank's shards."""
        ranges = {}
        for buffer in self.buffers:
            # A buffer is sharded over its own group: dp-cp for dense parameters, expert-dp for experts.
            rank = torch.distributed.get_rank(group=buffer.data_parallel_group)
            for bucket in buffer.buckets:
                shard_size = bucket.grad_data.numel() // buffer.data_parallel_world_size
                mine_start = bucket.offset + rank * shard_size
                mine_end = mine_start + shard_size
                for param in bucket.params_list:
                    start, end, _ = buffer.param_index_map[param]
                    lo, hi = max(start, mine_start), min(end, mine_end)
                    if lo < hi:
                        ranges[param] = (lo - start, hi - start)
        return ranges

    def _replace_params_by_shards(self) -> None:
        """Give torch's optimizer the fp32 main shards instead of the whole model params."""
        self.model_float16_params, self.shard_fp32_from_float16_params = [], []
        self.model_fp32_params, self.shard_fp32_params = [], []
        known = {p for buffer in self.buffers for p in buffer.params}
        for group in self.optimizer.param_groups:
            shards = []
            for model_param in group["params"]:
                if model_param not in known:
                    raise ValueError("a parameter in the optimizer has no place in any DDP gradient "
                                     "buffer: build the optimizer from the DDP-wrapped model chunks")
                if model_param not in self.param_range_map:
                    continue   # another DP rank owns all of it
                start, end = self.param_range_map[model_param]
                shard_model_param = model_param.detach().view(-1)[start:end]
                if is_fp8_param(model_param):   # --fp8-param-gather: fp32 main from the bf16 it was cast from
                    shard_main = take_init_val(model_param, start, end)
                    self.model_float16_params.append(model_param)
                    self.shard_fp32_from_float16_params.append(shard_main)
                elif model_param.dtype in _FLOAT16:
                    shard_main = shard_model_param.clone().float()
                    self.model_float16_params.append(model_param)
                    self.shard_fp32_from_float16_params.append(shard_main)
                else:
                    # fp32 model: the shard is a *view* of the parameter itself, so the step
                    # writes straight into the param buffer the all-gather sends from.
                    shard_main = shard_model_param
                    self.model_fp32_params.append(model_param)
                    self.shard_fp32_params.append(shard_main)
                copy_model_parallel_attributes(shard_main, model_param)
                shards.append(shard_main)
            group["params"] = shards
        # every fp8 parameter, mine or not: their casts reduce amaxes together (param_gather.py)
        self.model_fp8_params = [p for buffer in self.buffers for p in buffer.params if is_fp8_param(p)]
        for param in self.model_fp8_params:
            param.__dict__.pop("fp8_init_val", None)   # the main shards have it now (TE clears it too)

    def get_grad_stats_parallel_group(self):
        """Each DP rank holds different gradient entries now: norms and Inf checks span the world."""
        return parallel_state.get_group("intra-dist-opt")

    def get_expert_grad_stats_parallel_group(self):
        """The world counts the expert shards too, each once: no second reduction."""
        return None

    def _all_pairs(self):
        yield from zip(self.model_float16_params, self.shard_fp32_from_float16_params)
        yield from zip(self.model_fp32_params, self.shard_fp32_params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in (self.model_float16_params, self.model_fp32_params,
                      self.shard_fp32_from_float16_params, self.shard_fp32_params):
            _zero_grad_group_helper(group, set_to_none)

    def _collect_main_grad_data_for_unscaling(self):
        return [shard.grad for shard in self.shard_fp32_from_float16_params + self.shard_fp32_params
                if shard.grad is not None]

    def _copy_model_grads_to_main_grads(self) -> None:
        """My shard of the reduce-scattered main_grad becomes my main shard's .grad (in fp32)."""
        for model_param, shard_main in self._all_pairs():
            start, end = self.param_range_map[model_param]
            shard_main.grad = model_param.main_grad.view(-1)[start:end].float()

    def _copy_main_params_to_model_params(self) -> None:
        """Write my updated shards into the param buffer; start_param_sync gathers the rest.
        fp8 parameters: each rank casts its shards into the byte buffer (quantize_param_shard)."""
        fp8_mains = {}
        for model_param, shard_main in zip(self.model_float16_params, self.shard_fp32_from_float16_params):
            start, end = self.param_range_map[model_param]
            if is_fp8_param(model_param):
                fp8_mains[model_param] = (shard_main, start)
                continue
            model_param.detach().view(-1)[start:end].copy_(shard_main)
        quantize_param_shard(self.model_fp8_params, [fp8_mains.get(p, (None,))[0] for p in self.model_fp8_params],
                             [fp8_mains.get(p, (None, 0))[1] for p in self.model_fp8_params], self.data_parallel_group)

    @torch.no_grad()
    def reload_fp8_params(self) -> None:
        """After a checkpoint's optimizer state is loaded: the fp8 weights cast again from the
        fp32 main shards and gathered, as the step does (their scales are not in the checkpoint).
        The weight slots start afresh first, as every fp8 slot of a resumed run does, so this
        cast is the one a resumed run without --fp8-param-gather makes in its first forward."""
        for param in self.model_fp8_params:
            fresh = param.fp8_meta
            fresh.scale = torch.ones_like(fresh.scale)
            if hasattr(fresh, "history"):
                fresh.history = torch.zeros_like(fresh.history)
        self._copy_main_params_to_model_params()
        for model_chunk in self.model_chunks:
            model_chunk.start_param_sync(force_sync=True)

    def _copy_model_params_to_main_params(self) -> None:
        for model_param, shard_main in zip(self.model_float16_params, self.shard_fp32_from_float16_params):
            start, end = self.param_range_map[model_param]
            if is_fp8_param(model_param):
                shard_main.data.copy_(dequantized_shard(model_param, start, end))
                continue
            shard_main.data.copy_(model_param.detach().view(-1)[start:end])

    @torch.no_grad()
    def step_with_ready_grads(self) -> bool:
        update_successful = super().step_with_ready_grads()
        for model_chunk in self.model_chunks:
            # With overlap_param_gather the next forward's pre-hooks gather, bucket by bucket.
            if not model_chunk.ddp_config.overlap_param_gather:
                model_chunk.start_param_sync(force_sync=True)
        return update_successful

    def state_dict(self) -> dict:
        """This rank's shard of the state: save one such file per rank (ZeRO-1 checkpoints)."""
        state = {"optimizer": self.optimizer.state_dict(),
                 "shard_fp32_from_float16_params": self.shard_fp32_from_float16_params,
                 "data_parallel_rank": self.data_parallel_rank,
                 "data_parallel_world_size": self.data_parallel_world_size}
        if self.grad_scaler is not None:
            state["grad_scaler"] = self.grad_scaler.state_dict()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        saved = (state_dict["data_parallel_rank"], state_dict["data_parallel_world_size"])
        if saved != (self.data_parallel_rank, self.data_parallel_world_size):
            raise ValueError(f"this optimizer shard was saved by DP rank {saved[0]} of {saved[1]}, but is "
                             f"loaded by DP rank {self.data_parallel_rank} of {self.data_parallel_world_size}: "
                             "resume with the same data-parallel size")
        self.optimizer.load_state_dict(state_dict["optimizer"])
        if self.grad_scaler is not None and "grad_scaler" in state_dict:
            self.grad_scaler.load_state_dict(state_dict["grad_scaler"])
        for current, saved_param in zip(self.shard_fp32_from_float16_params,
                                        state_dict["shard_fp32_from_float16_params"]):
            current.data.copy_(saved_param.data)
