"""The optimizer of Megatron-FSDP: torch's Adam/SGD over the pieces of the units' shards.

Each parameter is handed to torch's optimizer as the part of it this rank owns (unit.piece):
a view into the unit's shard, with its gradient a view into the unit's gradient shard. With
``no_shard`` the piece is the whole parameter; otherwise rank r steps only its 1/dp, so the
Adam moments it keeps are 1/dp of the model's. The groups (weight decay, decoupled learning
rates) are decided per parameter before the cut, so a piece of a bias still gets no decay.

A 16-bit model is stepped through fp32 *main* copies of the pieces (as Megatron's
--megatron-fsdp-main-params-dtype fp32, its default), so that small updates are not lost to
bf16's spacing; an fp32 model's main piece is the model's piece itself, and so is a 16-bit
one's with ``auto`` (no copy: the step rounds to bf16). After the step the
main pieces are written back, and ``optim`` and ``optim_grads`` all-gather the updated shards
into the whole parameters; ``optim_grads_params`` keeps only shards, and the next forward gathers.
"""

from __future__ import annotations

from minitron.core import parallel_state
from minitron.core.optimizer import _get_param_groups, _make_grad_scaler, _make_torch_optimizer
from minitron.core.optimizer.optimizer import MixedPrecisionOptimizer, copy_model_parallel_attributes


class FSDPOptimizer(MixedPrecisionOptimizer):
    def __init__(self, config, model_chunks, grad_scaler):
        self.model_chunks = model_chunks
        self.sharded = model_chunks[0].strategy != "no_shard"
        unit_of = {p: unit for chunk in model_chunks for p, unit in chunk.unit_of.items()}
        # --megatron-fsdp-main-params-dtype: fp32 (Megatron's default), or auto (None): the model's own
        main_dtype = model_chunks[0].main_params_dtype or next(iter(unit_of)).dtype
        self.pieces = []   # (the model's piece, its fp32 main piece, its gradient piece)
        self.owned = {}    # param -> (its main piece, where the piece starts in param.view(-1)): the checkpoint's
        groups = _get_param_groups(model_chunks, config)
        for group in groups:
            mains = []
            for param in group["params"]:
                unit = unit_of[param]
                found = unit.piece(param)
                if found is None:
                    continue   # another rank owns all of this parameter
                piece, grad = found
                main = piece if piece.dtype == main_dtype else piece.detach().clone().to(main_dtype)
                copy_model_parallel_attributes(main, param)   # the norm skips TP duplicates by these
                self.pieces.append((piece, main, grad))
                self.owned[param] = (main, max(unit.offsets[param], unit.lo) - unit.offsets[param])
                mains.append(main)
            group["params"] = mains   # possibly empty: every rank keeps the same groups, in order
        super().__init__(_make_torch_optimizer(config, groups), config, grad_scaler)

    def get_grad_stats_parallel_group(self):
        """Sharded, each dp rank holds other entries: norms and Inf checks span dp too."""
        if self.sharded:
            return parallel_state.get_group("intra-dist-opt")
        return super().get_grad_stats_parallel_group()

    def get_expert_grad_stats_parallel_group(self):
        """Sharded, the pieces of every rank count each expert element once, over the same
        group as the dense ones (the distributed optimizer's rule); whole, the replicas' rule."""
        if self.sharded:
            return None
        return super().get_expert_grad_stats_parallel_group()

    def _copy_model_grads_to_main_grads(self) -> None:
        for _, main, grad in self.pieces:   # a view when the dtypes agree; clipping scales it in place
            main.grad = grad if grad.dtype == main.dtype else grad.to(main.dtype)

    def _collect_main_grad_data_for_unscaling(self):
        return [main.grad for _, main, _ in self.pieces if main.grad is not None]

    def _copy_main_params_to_model_params(self) -> None:
        for piece, main, _ in self.pieces:
            if main is not piece:
                piece.copy_(main)
        for chunk in self.model_chunks:
            chunk.sync_params_after_step()

    def _copy_model_params_to_main_params(self) -> None:
        for piece, main, _ in self.pieces:
            if main is not piece:
                main.data.copy_(piece)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, main, _ in self.pieces:
            main.grad = None

    def state_dict(self) -> dict:
        raise NotImplementedError("Megatron-FSDP's optimizer shards are saved by parameter, through "
                                  "--ckpt-format fsdp_dtensor (training/checkpointing_fsdp_dtensor.py)")

    def load_state_dict(self, state_dict: dict) -> None:
        raise NotImplementedError("Megatron-FSDP's optimizer shards are loaded by parameter, through "
                                  "--ckpt-format fsdp_dtensor (training/checkpointing_fsdp_dtensor.py)")


def get_fsdp_optimizer(config, model_chunks) -> FSDPOptimizer:
    if config.lr is None:
        raise ValueError("OptimizerConfig.lr is not set: give the peak learning rate (--lr)")
    return FSDPOptimizer(config, model_chunks, _make_grad_scaler(config))
