"""get_megatron_optimizer: from model chunks and an OptimizerConfig to a MegatronOptimizer.

Which wrapper (Megatron's choice, in this order):

    use_distributed_optimizer        -> DistributedOptimizer      (fp32 main shards; ZeRO-1)
    fp16 or bf16                     -> Float16OptimizerWithFloat16Params
    otherwise                        -> FP32Optimizer

Adam here is torch.optim.AdamW: Megatron's Adam is Apex/Transformer Engine FusedAdam in its
default ``adam_w_mode``, i.e. weight decay is *decoupled* (w -= lr * wd * w, apart from the
moments), and without those libraries Megatron itself falls back to torch.optim.AdamW. SGD is
torch.optim.SGD, whose weight decay is the classic L2 term added to the gradient.
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state
from minitron.core.optimizer.distrib_optimizer import DistributedOptimizer
from minitron.core.optimizer.grad_scaler import ConstantGradScaler, DynamicGradScaler
from minitron.core.optimizer.optimizer import (
    Float16OptimizerWithFloat16Params, FP32Optimizer, MegatronOptimizer,
)
from minitron.core.optimizer.optimizer_config import OptimizerConfig
from minitron.trace import traced

__all__ = ["get_megatron_optimizer", "OptimizerConfig", "MegatronOptimizer", "FP32Optimizer",
           "Float16OptimizerWithFloat16Params", "DistributedOptimizer",
           "ConstantGradScaler", "DynamicGradScaler"]


def _get_param_groups(model_chunks, no_weight_decay_cond=None, scale_lr_cond=None,
                      lr_mult: float = 1.0) -> list[dict]:
    """Split parameters by (wd_mult, lr_mult): biases and 1-D parameters get no weight decay.

    Decay pulls a weight towards zero. For a matrix that is regularisation; for a layernorm
    gain (whose neutral value is 1) or a bias it only fights the model, so Megatron exempts
    every parameter that is 1-D or named ``*.bias``.
    """
    groups: dict[tuple[float, float], list] = {}
    for chunk in model_chunks:
        for name, param in chunk.named_parameters():
            if not param.requires_grad:
                continue
            if no_weight_decay_cond is not None:
                no_wd = no_weight_decay_cond(name, param)
            else:
                no_wd = name.endswith(".bias") or param.dim() == 1
            scale_lr = scale_lr_cond is not None and scale_lr_cond(name, param)
            key = (0.0 if no_wd else 1.0, lr_mult if scale_lr else 1.0)
            groups.setdefault(key, []).append(param)
    # Sorted keys: every rank builds its groups in the same order (checkpoints rely on it).
    return [{"params": params, "wd_mult": wd_mult, "lr_mult": mult}
            for (wd_mult, mult), params in sorted(groups.items(), reverse=True)]


def _make_torch_optimizer(config: OptimizerConfig, param_groups) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        return torch.optim.AdamW(param_groups, lr=config.lr, weight_decay=config.weight_decay,
                                 betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps)
    return torch.optim.SGD(param_groups, lr=config.lr, weight_decay=config.weight_decay,
                           momentum=config.sgd_momentum)


def _make_grad_scaler(config: OptimizerConfig):
    """A constant scale if one was given; dynamic scaling for fp16; none for bf16/fp32."""
    if config.loss_scale:
        return ConstantGradScaler(config.loss_scale)
    if config.fp16:
        return DynamicGradScaler(initial_scale=config.initial_loss_scale, min_scale=config.min_loss_scale,
                                 growth_factor=2.0, backoff_factor=0.5,
                                 growth_interval=config.loss_scale_window, hysteresis=config.hysteresis)
    return None


@traced(args=lambda config, model_chunks, *a, **k: {"optimizer": config.optimizer, "fp16": config.fp16,
                                                     "bf16": config.bf16, "chunks": len(model_chunks),
                                                     "distributed": config.use_distributed_optimizer})
def get_megatron_optimizer(config: OptimizerConfig, model_chunks, no_weight_decay_cond=None,
                           scale_lr_cond=None, lr_mult: float = 1.0) -> MegatronOptimizer:
    """Build the optimizer for this rank's model chunks (a list of DDP-wrapped modules)."""
    if config.lr is None:
        raise ValueError("OptimizerConfig.lr is not set: give the peak learning rate (--lr)")
    param_groups = _get_param_groups(model_chunks, no_weight_decay_cond, scale_lr_cond, lr_mult)
    optimizer = _make_torch_optimizer(config, param_groups)
    grad_scaler = _make_grad_scaler(config)
    if config.use_distributed_optimizer:
        per_model_buffers = {i: getattr(chunk, "buffers", None) for i, chunk in enumerate(model_chunks)}
        if any(buffers is None for buffers in per_model_buffers.values()):
            raise ValueError("use_distributed_optimizer needs every model chunk wrapped in "
                             "DistributedDataParallel (with ddp_config.use_distributed_optimizer=True)")
        return DistributedOptimizer(optimizer, config, grad_scaler, model_chunks, per_model_buffers,
                                    parallel_state.get_data_parallel_group(with_context_parallel=True))
    if config.fp16 or config.bf16:
        return Float16OptimizerWithFloat16Params(optimizer, config, grad_scaler)
    return FP32Optimizer(optimizer, config)
