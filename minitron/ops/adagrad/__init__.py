"""``deepspeed.ops.adagrad``: DeepSpeedCPUAdagrad, what a ds_config's "Adagrad" builds under
ZeRO-Offload (elsewhere DeepSpeed builds torch.optim.Adagrad)."""

from minitron.ops.adagrad.cpu_adagrad import DeepSpeedCPUAdagrad

__all__ = ["DeepSpeedCPUAdagrad"]
