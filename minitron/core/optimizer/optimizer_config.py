"""OptimizerConfig: which optimizer, its hyper-parameters, precision and loss scaling.

Field names and defaults are Megatron's (megatron/core/optimizer/optimizer_config.py), so a
run configured for one reads the same for the other. ``lr`` and ``min_lr`` are the peak and
floor the OptimizerParamScheduler moves between; the optimizer itself starts at ``lr``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class OptimizerConfig:
    optimizer: str = "adam"                 # 'adam' (decoupled weight decay, i.e. AdamW) or 'sgd'
    lr: float | None = None
    min_lr: float | None = None
    decoupled_lr: float | None = None       # the embedding's and output layer's own peak lr
    decoupled_min_lr: float | None = None   # ... and floor (default: min_lr)
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-08
    sgd_momentum: float = 0.9

    # Precision of the model's parameters. fp16/bf16 models get fp32 "main" copies to step.
    fp16: bool = False
    bf16: bool = False
    params_dtype: torch.dtype = torch.float32

    # Loss scaling (fp16 always; bf16 only if loss_scale is given). loss_scale set: constant.
    loss_scale: float | None = None
    initial_loss_scale: float = 2 ** 32
    min_loss_scale: float = 1.0
    loss_scale_window: float = 1000         # clean steps before the scale doubles
    hysteresis: int = 2                     # overflows tolerated before the scale halves

    clip_grad: float = 1.0                  # max global L2 norm; 0 turns clipping off
    use_distributed_optimizer: bool = False
    log_num_zeros_in_grad: bool = False

    def __post_init__(self):
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"OptimizerConfig.optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if self.fp16 and self.bf16:
            raise ValueError("OptimizerConfig: fp16 and bf16 exclude each other; choose one")
        wanted = torch.float16 if self.fp16 else torch.bfloat16 if self.bf16 else None
        if wanted is not None and self.params_dtype == torch.float32:
            self.params_dtype = wanted   # the flag decides; Megatron's arguments do the same
        if self.lr is not None and self.min_lr is not None and self.min_lr > self.lr:
            raise ValueError(f"OptimizerConfig: min_lr {self.min_lr} is above lr {self.lr}")
        if self.clip_grad < 0:
            raise ValueError(f"OptimizerConfig.clip_grad must be >= 0 (0 = off), got {self.clip_grad}")
