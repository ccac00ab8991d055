"""The autograd functions that give a loss born inside the model the main loss's backward scale.

An MoE router's load-balancing (and z-) loss and the MTP layers' losses are not added to the
loss the schedule calls backward on. Each is hung on a tensor of the forward, where the function
is the identity; its backward then seeds the hung loss with the gradient the main loss got
(1 / micro-batches, x the fp16 loss scale), a scale the schedule sets every step.

They live here, beside the schedules, and moe_utils.py / multi_token_prediction.py re-export
them under Megatron's names: the schedule sets their scales, and importing those model modules
from it would run minitron.core.transformer's __init__, whose config imports this package back.
"""

from __future__ import annotations

import torch


class LossAutoScaler(torch.autograd.Function):
    """The forward both scalers share: ``output`` unchanged, ``loss`` kept for the backward."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, loss: torch.Tensor):
        ctx.save_for_backward(loss)
        return output


class MoEAuxLossAutoScaler(LossAutoScaler):
    """Identity on ``output`` forward; backward also starts a backward from ``aux_loss``.

    The aux loss is born deep inside the model, far from the loss the schedule calls backward
    on. Attached here, it needs no path of its own: when the gradient reaches ``output``, the
    aux loss gets d(aux)/d(aux) = the same scale the main loss got (set per step by the
    schedule: 1 / num_microbatches, times the fp16 loss scale).
    """

    main_loss_backward_scale: torch.Tensor | None = None

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (aux_loss,) = ctx.saved_tensors
        scale = MoEAuxLossAutoScaler.main_loss_backward_scale
        if scale is None:
            scale = torch.tensor(1.0, device=aux_loss.device)
        return grad_output, torch.ones_like(aux_loss) * scale

    @staticmethod
    def set_loss_scale(scale: torch.Tensor) -> None:
        MoEAuxLossAutoScaler.main_loss_backward_scale = scale.detach().reshape(())


class MTPLossAutoScaler(LossAutoScaler):
    """Identity on ``output``; backward also seeds ``mtp_loss`` with the main loss's scale (the
    schedule sets it per micro-batch: 1 / micro-batches, x the fp16 loss scale)."""

    main_loss_backward_scale: torch.Tensor = torch.tensor(1.0)  # host: a 0-d scale multiplies a tensor on any device

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (mtp_loss,) = ctx.saved_tensors
        return grad_output, torch.ones_like(mtp_loss) * MTPLossAutoScaler.main_loss_backward_scale

    @staticmethod
    def set_loss_scale(scale: torch.Tensor) -> None:
        MTPLossAutoScaler.main_loss_backward_scale = scale
