"""``zero_optimization.ignore_unused_parameters`` false at ZeRO stages 0-2: a parameter of my
partition that had no gradient since the last step stops an offloaded step, as DeepSpeed's
``DeepSpeedZeroOptimizer`` asserts in ``complete_grad_norm_calculation_for_cpu_offload``."""

from __future__ import annotations

import torch

from minitron.runtime.zero.buckets import weakly_bound


class UnusedParameterCheck:
    # the ids of the parameters that received a gradient since the last step; None: not checked
    used = None

    def track_unused_parameters(self, on: bool) -> None:
        """ignore_unused_parameters false. DeepSpeed checks it where it sums the offloaded norm
        one parameter at a time (complete_grad_norm_calculation_for_cpu_offload): a parameter of
        my partition that never received a gradient has no norm, and the step asserts. Without
        offload nothing reads the key, there or here."""
        if not on or not self.offload.optimizer:
            return
        self.used = set()
        for params in self.bit16_groups:
            for p in params:
                p.register_post_accumulate_grad_hook(weakly_bound(self._mark_used))

    def _mark_used(self, p: torch.Tensor) -> None:
        self.used.add(id(p))

    def _check_unused(self) -> None:
        for i, params in enumerate(self.bit16_groups):
            size, offset = self.bit16_groups_flat[i].numel() // self.partition_count, 0
            mine = range(self.partition_id * size, (self.partition_id + 1) * size)
            for p in params:
                if id(p) not in self.used and offset < mine.stop and offset + p.numel() > mine.start:
                    raise RuntimeError(f"a parameter of shape {tuple(p.shape)} was not used in producing the loss "
                                       "(DeepSpeed's assertion with offload_optimizer): set zero_optimization."
                                       "ignore_unused_parameters true, or make every trainable parameter take part")
                offset += p.numel()
        self.used = set()
