"""What a ZeRO stage 0-2 rank holds between steps, in bytes: the device's (``bytes_held``) and the
host's under ZeRO-Offload (``host_bytes_held``). The engine's own ``bytes_held`` answers with these,
and tests/test_estimate_zero.py holds the estimator's per-stage formulas (theoretical_zero.py) to them."""

from __future__ import annotations

from minitron.runtime.zero.offload import state_bytes


class HeldBytes:
    def bytes_held(self) -> dict:
        """Bytes this rank holds: parameters (the flat buffers, padding included), gradients
        between micro-batches, optimizer states (fp32 master + the moments)."""
        params = sum(f.numel() * f.element_size() for f in self.bit16_groups_flat)
        if self.partition_gradients:
            grads = sum(g.numel() * g.element_size() for g in self.averaged_gradients.values())
        else:
            grads = sum(p.grad.numel() * p.grad.element_size()
                        for ps in self.bit16_groups for p in ps if p.grad is not None)
        return {"params": params, "grads": grads, "optimizer_states": self._optimizer_state_bytes()}

    def _optimizer_state_bytes(self) -> int:
        """On the device: the masters and moments (none of them when offloaded)."""
        return 0 if self.offload.optimizer else state_bytes(self.optimizer, self.single_partition_of_fp32_groups)

    def host_bytes_held(self) -> dict:
        """What offloading keeps in host memory between steps (bytes_held: the device's)."""
        states = state_bytes(self.optimizer, self.single_partition_of_fp32_groups) if self.offload.optimizer else 0
        return {"params": 0, "optimizer_states": states}
