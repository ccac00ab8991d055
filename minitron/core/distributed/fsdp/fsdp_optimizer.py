"""The optimizer of Megatron-FSDP: torch's Adam/SGD over the pieces of the units' shards.

Each parameter is handed to torch's optimizer as the part of it this rank owns (unit.piece):
a view into the unit's shard, with its gradient a view into the unit's gradient shard. With
``no_shard`` the piece is the whole parameter; otherwise rank r steps only its 1/dp, so the
Adam moments it keeps are 1/dp of the model's. The groups (weight decay, decoupled learning
rates) are decided per parameter before the cut, so a piece of a bias still gets no decay.

After the step, ``optim`` and ``optim_grads`` all-gather the updated shards into the whole
parameters; ``optim_grads_params`` keeps only shards, and the next forward gathers.
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state
from minitron.core.optimizer import _get_param_groups, _make_torch_optimizer
from minitron.core.optimizer.optimizer import FP32Optimizer, copy_model_parallel_attributes


class FSDPOptimizer(FP32Optimizer):
    def __init__(self, config, model_chunks):
        self.model_chunks = model_chunks
        self.sharded = model_chunks[0].strategy != "no_shard"
        unit_of = {p: unit for chunk in model_chunks for p, unit in chunk.unit_of.items()}
        groups = _get_param_groups(model_chunks, config)
        for group in groups:
            pieces = []
            for param in group["params"]:
                found = unit_of[param].piece(param)
                if found is None:
                    continue   # another rank owns all of this parameter
                piece, grad = found
                piece.main_grad = grad   # FP32Optimizer.prepare_grads hands it over as .grad
                copy_model_parallel_attributes(piece, param)
                pieces.append(piece)
            group["params"] = pieces   # possibly empty: every rank keeps the same groups, in order
        super().__init__(_make_torch_optimizer(config, groups), config)

    def get_grad_stats_parallel_group(self):
        """Sharded, each dp rank holds other entries: norms and zero counts span dp too."""
        if self.sharded:
            return parallel_state.get_group("intra-dist-opt")
        return super().get_grad_stats_parallel_group()

    @torch.no_grad()
    def step_with_ready_grads(self) -> bool:
        self.optimizer.step()
        for chunk in self.model_chunks:
            chunk.sync_params_after_step()
        return True

    def state_dict(self) -> dict:
        raise NotImplementedError("saving Megatron-FSDP's optimizer shards is not built here")


def get_fsdp_optimizer(config, model_chunks) -> FSDPOptimizer:
    if config.lr is None:
        raise ValueError("OptimizerConfig.lr is not set: give the peak learning rate (--lr)")
    if config.fp16 or config.bf16:
        raise ValueError("Megatron-FSDP here keeps fp32 parameters only (no fp32 main shards of 16-bit "
                         "weights yet): drop --bf16/--fp16")
    return FSDPOptimizer(config, model_chunks)
