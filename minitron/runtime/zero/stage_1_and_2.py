"""ZeRO stages 0, 1 and 2: DeepSpeed's ``DeepSpeedZeroOptimizer`` (``zero/stage_1_and_2.py``).

The layout, per param group, as DeepSpeed builds it:

    bit16_groups_flat[i]   every parameter of the group, copied end to end into one flat buffer,
                           padded to a multiple of 2 × dp (DeepSpeed's nccl_start_alignment_factor
                           is 2 elements = 4 bytes of fp16); the model's parameters become views
                           into it, so one collective moves them all
    parallel_partitioned_bit16_groups[i]
                           that buffer cut into dp equal, contiguous partitions: rank r owns
                           partition r
    single_partition_of_fp32_groups[i]
                           an fp32 copy of *my* partition: the master weights. The wrapped torch
                           optimizer sees only these, so its Adam moments are my partition's too.

What each stage keeps per rank (P = parameter elements):

    stage 0   parameters P, gradients P, optimizer states P   (gradients all-reduced)
    stage 1   parameters P, gradients P, optimizer states P/dp
    stage 2   parameters P, gradients P/dp, optimizer states P/dp

Stage 0 runs through the same code with one partition, the whole buffer: this is DeepSpeed's
fp16 path at stage 0 (FP16_Optimizer also keeps one flat fp32 master); in fp32 DeepSpeed hands
the module's own tensors to torch instead, which computes the same numbers.

A step: check every partition for Inf/NaN (an overflow skips the step on all ranks), compute the
global gradient norm (each rank's partition, squares summed over the data-parallel group), unscale
and clip in one multiply, let the torch optimizer update my fp32 partition, copy it into my bit16
partition, and all-gather the partitions so every rank has the whole model again.

Beside this file, by concept: how the layout above is built (stage_1_and_2_layout.py), the
unused-parameter check of ignore_unused_parameters false (stage_1_and_2_unused.py), and the
bytes a rank holds (stage_1_and_2_memory.py); the class takes them in as mixins.
"""

from __future__ import annotations

import torch

from minitron import comm as dist   # as DeepSpeed's ZeRO: from deepspeed import comm as dist
from minitron.accelerator import get_accelerator
from minitron.runtime.gradient_reduction import GradientReduction
from minitron.runtime.zero.buckets import GradientBuckets
from minitron.runtime.zero.muon.muon_optimizer import orthogonalise_flat_gradient
from minitron.runtime.zero.offload import ZeroOffload
from minitron.runtime.zero.stage_1_and_2_layout import FlatPartitionLayout
from minitron.runtime.zero.stage_1_and_2_memory import HeldBytes
from minitron.runtime.zero.stage_1_and_2_unused import UnusedParameterCheck


def _has_inf_or_nan(tensor: torch.Tensor) -> torch.Tensor:
    """1.0 if ``tensor`` holds an Inf or a NaN, else 0.0: a tensor on its device, so that the
    flags of every partition add up there and only the step's one verdict crosses to the host."""
    values = tensor.float()
    return values.isinf().logical_or(values.isnan()).any().float()


class DeepSpeedZeroOptimizer(FlatPartitionLayout, UnusedParameterCheck, HeldBytes):
    # bf16.check_grad_overflow (the engine sets it for bf16 at stages 1-2): false skips the Inf/NaN
    # check, so a non-finite gradient is stepped into the weights, as DeepSpeed does then
    check_grad_overflow = True
    # zero_optimization.compute_grad_norm (stages 1-2; the config refuses it with clipping or
    # offload, as DeepSpeed does): false skips the norm and its all-reduce, one collective less
    # a step, and get_global_grad_norm() answers None
    compute_grad_norm = True
    # zero_optimization.use_multi_rank_bucket_allreduce: a bucket's gradients all-reduced in one
    # call (DeepSpeed's default), or reduced onto each owner in turn (buckets.py)
    use_multi_rank_bucket_allreduce = True
    # zero_optimization.elastic_checkpoint: the optimizer file in a form any dp size can load
    # (checkpoint/elastic_checkpoint.py)
    elastic_checkpoint = False

    def __init__(self, init_optimizer: torch.optim.Optimizer, dp_process_group, stage: int, loss_scaler,
                 clip_grad: float = 0.0, model_parallel_group=None, reduce_bucket_size: int = 500_000_000,
                 model_parallel_rank: int | None = None, overlap_comm: bool = False,
                 round_robin_gradients: bool = False, offload_optimizer=None):
        self.optimizer = init_optimizer
        self._init_model_parallel(model_parallel_group, model_parallel_rank)
        self.dp_process_group = dp_process_group
        self.dp_world_size = dist.get_world_size(group=dp_process_group)
        self.stage = stage
        self.partition_gradients = stage >= 2
        # Stage 0: one partition, the whole buffer, every rank keeps it all (see the margin above).
        self.partition_count = self.dp_world_size if stage >= 1 else 1
        self.partition_id = dist.get_rank(group=dp_process_group) if stage >= 1 else 0
        self.loss_scaler = loss_scaler
        self.clip_grad = clip_grad
        # The sum's dtype and where its 1/dp goes; the engine replaces it by the config's (gradient_reduction.py).
        self.gradient_reduction = GradientReduction(self.dp_world_size, "engine" if stage == 0 else "divide",
                                                    all_reduce=stage == 0)
        # Where this rank computes: the flat buffers follow the parameters (the engine has moved
        # the module here); the step's own small tensors (overflow flag, norm) are made here.
        self.device = torch.device(get_accelerator().current_device_name())
        # offload_optimizer: the masters and the moments on the host (zero/offload.py)
        self.offload = ZeroOffload(offload_optimizer, None, self.device)
        self.overflow = False
        self._global_grad_norm = None
        self.bit16_groups, self.bit16_groups_flat = [], []
        self.parallel_partitioned_bit16_groups, self.single_partition_of_fp32_groups = [], []
        self.averaged_gradients: dict = {}   # group -> my partition's reduced gradient
        for group in init_optimizer.param_groups:   # flat buffer, partitions, master (stage_1_and_2_layout.py)
            self._partition_group(group, round_robin_gradients)
        # Stage 2 reduces in backward, bucket by bucket (buckets.py); so does stage 1 with
        # overlap_comm, in the boundary's backward only. Otherwise stages 0 and 1 reduce once,
        # after the boundary's backward. The engine sets the flag before each backward.
        self.overlap_comm = overlap_comm and stage >= 1
        self.is_gradient_accumulation_boundary = True
        in_backward = self.partition_gradients or self.overlap_comm
        self.buckets = GradientBuckets(self, reduce_bucket_size, self.overlap_comm) if in_backward else None
        self.reduce_bucket_size = reduce_bucket_size

    # --- gradients ------------------------------------------------------------------------

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale

    def get_loss_scale(self) -> float:
        return float(self.loss_scale)

    def backward(self, loss: torch.Tensor) -> None:
        (loss.float() * self.loss_scale).backward()

    def _flat_grad(self, i: int) -> torch.Tensor:
        flat = torch.zeros_like(self.bit16_groups_flat[i])
        offset = 0
        for p in self.bit16_groups[i]:
            if p.grad is not None:
                flat[offset:offset + p.numel()].copy_(p.grad.reshape(-1))
            offset += p.numel()
        return flat

    def reduce_gradients(self, is_gradient_accumulation_boundary: bool, all_reduce: bool = True) -> None:
        """Called after every backward. Stages 0 and 1 let gradients accumulate in ``p.grad`` and
        reduce once, at the boundary: an all-reduce (stage 0) or a reduce-scatter into each
        rank's partition (stage 1). Stage 2 (and stage 1 with overlap_comm, at the boundary) has
        reduced all but its last bucket during backward; the last one goes now, so the full
        gradient never outlives its micro-batch."""
        if self.partition_gradients or (self.buckets and is_gradient_accumulation_boundary):
            self.buckets.finish()   # the last bucket, and the wait for those in flight
            return
        if not is_gradient_accumulation_boundary or self.buckets:
            return
        if not all_reduce:   # stage 0 under 1-bit Adam's compressed stage: the engine reduces nothing
            self.averaged_gradients = {i: self._flat_grad(i) for i in range(len(self.bit16_groups))}
            return
        reduction = self.gradient_reduction   # sum over ranks -> mean, in the configured dtype
        if reduction.per_param_dtype:   # torch_autocast, stage 1: DeepSpeed's per-dtype buckets (buckets.py)
            GradientBuckets(self, self.reduce_bucket_size, hooks=False).reduce_all()
            return
        for i in range(len(self.bit16_groups)):
            flat = self._flat_grad(i)
            wire, size = reduction.to_wire(flat), flat.numel() // self.partition_count
            if reduction.all_reduce:   # stage 0; stage 1 keeps its partition of the whole sum
                dist.all_reduce(wire, group=self.dp_process_group)
                mine = wire.narrow(0, self.partition_id * size, size)
            else:
                mine = wire.new_empty(size)
                dist.reduce_scatter_tensor(mine, wire, group=self.dp_process_group)
            self.averaged_gradients[i] = reduction.from_wire(mine, flat.dtype)

    # --- the step --------------------------------------------------------------------------

    def has_overflow(self, partitions: list) -> bool:
        """Does any rank's gradient hold an Inf or NaN? The flags add up on the device, one
        all-reduce (MAX) per group joins the ranks, and the host reads the verdict once: the
        step's one wait for the device, as in DeepSpeed (the step cannot go on without it)."""
        flag = torch.zeros(1, device=self.device)
        for g in partitions:
            if g is not None:
                flag += _has_inf_or_nan(g)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.dp_process_group)
        if self.model_parallel_group is not None:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.model_parallel_group)
        return bool(flag.item())

    def scaled_global_norm(self) -> torch.Tensor:
        """The L2 norm of the whole (still loss-scaled) gradient: my partition's squares, summed
        over the ranks that hold the other partitions. Padding is zero and adds nothing. It stays
        on the device: the clip below uses it there, and only a caller that logs it reads it."""
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        for i, g in self.averaged_gradients.items():
            total += (g.double().pow(2) * self.norm_mask[i]).sum()
        if self.partition_count > 1:
            dist.all_reduce(total, group=self.dp_process_group)
        if self.model_parallel_group is not None:
            dist.all_reduce(total, group=self.model_parallel_group)
        return total.sqrt()

    def unscale_and_clip_grads(self, grads: list, total_norm: torch.Tensor) -> None:
        # One multiply does both: divide by the loss scale, and by the clip factor when the
        # unscaled norm exceeds gradient_clipping (DeepSpeed adds 1e-6 against a zero norm).
        # The factor is a device tensor, so deciding whether to clip waits for nothing.
        combined_scale = self.loss_scale
        if self.clip_grad > 0.0:
            clip = ((total_norm / self.loss_scale + 1e-6) / self.clip_grad).clamp(min=1.0)
            combined_scale = clip * self.loss_scale
        factor = 1.0 / combined_scale
        for g in grads:   # (an offloaded gradient is a host tensor: the factor goes to it)
            g.mul_(factor.to(g.device) if torch.is_tensor(factor) else factor)

    @torch.no_grad()
    def step(self) -> None:
        prepared = self._prepare_step()
        if prepared is None:
            return
        for i, master in enumerate(self.single_partition_of_fp32_groups):
            self._set_grad(i, master, *prepared)
            if self.optimizer.param_groups[i].get("use_muon"):   # stage 0 only (config.py): the whole matrices
                orthogonalise_flat_gradient(self.optimizer, self.optimizer.param_groups[i], master,
                                            self.bit16_groups[i])
        self.optimizer.step()
        for i, master in enumerate(self.single_partition_of_fp32_groups):
            master.grad = None
            self._publish(i)
        self.zero_grad()

    def _prepare_step(self):
        """The step's checks, for every group at once: (the reduced partitions, the scaled
        norm), or None when an overflow skips the step."""
        partitions = [self.averaged_gradients.get(i) for i in range(len(self.single_partition_of_fp32_groups))]
        # one rank's Inf skips the step everywhere (unless bf16.check_grad_overflow is false)
        self.overflow = self.check_grad_overflow and self.has_overflow(partitions)
        prev_scale = self.loss_scale
        self.loss_scaler.update_scale(self.overflow)
        if self.overflow:
            self.zero_grad()
            return None
        if self.used is not None:
            self._check_unused()
        scaled_norm = self.scaled_global_norm() if self.compute_grad_norm else None
        # a device tensor: read when logged
        self._global_grad_norm = scaled_norm / prev_scale if self.compute_grad_norm else None
        return partitions, scaled_norm

    def _set_grad(self, i: int, master: torch.Tensor, partitions: list, scaled_norm) -> None:
        """Group i's reduced gradient, unscaled and clipped, as its master's .grad."""
        grad = partitions[i] if partitions[i] is not None else torch.zeros_like(master)
        # offloaded: fp32 on the device, then across to the master on the host
        grad = self.offload.copy_gradients_to_host(grad, i) if self.offload.optimizer else grad.float()
        self.unscale_and_clip_grads([grad], scaled_norm)
        master.grad = grad

    def _publish(self, i: int) -> None:
        """My updated fp32 partition -> my bit16 partition -> everyone's flat buffer."""
        self.offload.publish(self.single_partition_of_fp32_groups[i],
                             self.parallel_partitioned_bit16_groups[i][self.partition_id], i)
        if self.partition_count > 1:
            dist.all_gather_into_tensor(self.bit16_groups_flat[i],
                                        self.parallel_partitioned_bit16_groups[i][self.partition_id],
                                        group=self.dp_process_group)

    def zero_grad(self) -> None:
        self.averaged_gradients = {}
        for params in self.bit16_groups:
            for p in params:
                p.grad = None

    # --- what the wrapped optimizer holds (the bytes a rank holds: stage_1_and_2_memory.py) ---

    @property
    def param_groups(self) -> list:
        return self.optimizer.param_groups
