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
from minitron.core.optimizer.float16_optimizer import Float16OptimizerWithFloat16Params
from minitron.core.optimizer.optimizer import FP32Optimizer, MegatronOptimizer
from minitron.core.optimizer.optimizer_config import OptimizerConfig
from minitron.trace import traced

__all__ = ["get_megatron_optimizer", "OptimizerConfig", "MegatronOptimizer", "FP32Optimizer",
           "Float16OptimizerWithFloat16Params", "DistributedOptimizer",
           "ConstantGradScaler", "DynamicGradScaler"]


def _get_param_groups(model_chunks, config: OptimizerConfig | None = None, no_weight_decay_cond=None) -> list[dict]:
    """Group the parameters by what the schedule does to them (Megatron-Core 0.19's overrides).

    Weight decay pulls a weight towards zero. For a matrix that is regularisation; for a
    layernorm gain (whose neutral value is 1) or a bias it only fights the model, so Megatron
    exempts every parameter that is 1-D or named ``*.bias`` (``wd_mult`` 0).

    ``config.decoupled_lr`` (--decoupled-lr) gives the word embedding and the output layer
    (the parameters marked ``is_embedding_or_output_parameter``) a peak learning rate of their
    own, and ``decoupled_min_lr`` a floor: their group carries ``max_lr`` / ``min_lr``, which
    the OptimizerParamScheduler reads in place of its own. The other groups carry the config's
    lr and min_lr, and ``default_config`` True: the logged lr is theirs.
    """
    decoupled = config is not None and config.decoupled_lr is not None
    groups: dict[tuple, list] = {}
    for chunk in model_chunks:
        for name, param in chunk.named_parameters():
            if not param.requires_grad:
                continue
            if no_weight_decay_cond is not None:
                no_wd = no_weight_decay_cond(name, param)
            else:
                no_wd = name.endswith(".bias") or param.dim() == 1
            override = {"wd_mult": 0.0} if no_wd else {}
            if decoupled and getattr(param, "is_embedding_or_output_parameter", False):
                override["max_lr"] = config.decoupled_lr
                if config.decoupled_min_lr is not None:
                    override["min_lr"] = config.decoupled_min_lr
            groups.setdefault(tuple(sorted(override.items())), []).append(param)
    # Sorted as Megatron sorts them (no override first): every rank builds its groups in the
    # same order, and checkpoints rely on it.
    base = {"wd_mult": 1.0, "max_lr": getattr(config, "lr", None), "min_lr": getattr(config, "min_lr", None)}
    base = {k: v for k, v in base.items() if v is not None}   # unset: the scheduler's own value
    return [{"params": params, **base, **dict(key), "default_config": not any("lr" in k for k, _ in key)}
            for key, params in sorted(groups.items())]


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
def get_megatron_optimizer(config: OptimizerConfig, model_chunks, no_weight_decay_cond=None) -> MegatronOptimizer:
    """Build the optimizer for this rank's model chunks (a list of DDP-wrapped modules)."""
    if config.lr is None:
        raise ValueError("OptimizerConfig.lr is not set: give the peak learning rate (--lr)")
    param_groups = _get_param_groups(model_chunks, config, no_weight_decay_cond)
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
