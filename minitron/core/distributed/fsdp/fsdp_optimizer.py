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

An fp8 weight (--fp8-param-gather) has an fp32 main piece made from the bf16 value it was cast
from, and the step writes it back by casting: every rank casts its main piece into its fp8
piece (core/fp8/param_gather.py, as the distributed optimizer does; TE's
cast_master_weights_to_fp8 in Megatron-FSDP), so what the units gather is fp8 already.
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state
from minitron.core.fp8.param_gather import is_fp8_param, quantize_param_shard, take_init_val
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
                start = max(unit.offsets[param], unit.lo) - unit.offsets[param]
                if is_fp8_param(param):   # from the bf16 it was cast from; fp32 whatever main_dtype says
                    main = take_init_val(param, start, start + piece.numel())
                else:
                    main = piece if piece.dtype == main_dtype else piece.detach().clone().to(main_dtype)
                copy_model_parallel_attributes(main, param)   # the norm skips TP duplicates by these
                self.pieces.append((piece, main, grad))
                if is_fp8_param(param):
                    main.fp8_param = param   # whose bytes (and 1/scale) the step casts it into
                self.owned[param] = (main, start)
                mains.append(main)
            group["params"] = mains   # possibly empty: every rank keeps the same groups, in order
        # every fp8 weight, mine or not, in the units' order (the same on every rank): their
        # casts reduce the amaxes together (param_gather.py)
        self.fp8_params = [p for chunk in model_chunks for unit in chunk.units for p in unit.params
                           if is_fp8_param(p)]
        for param in self.fp8_params:
            param.__dict__.pop("fp8_init_val", None)   # the main pieces have it now (TE clears it too)
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
        fp8 = {}   # fp8 weight -> (its main piece, its fp8 piece)
        for piece, main, _ in self.pieces:
            if is_fp8_param(piece):
                fp8[main.fp8_param] = (main, piece)
            elif main is not piece:
                piece.copy_(main)
        if self.fp8_params:
            mine = [fp8.get(p, (None, None)) for p in self.fp8_params]
            quantize_param_shard(self.fp8_params, [m for m, _ in mine], [0] * len(mine),
                                 self.model_chunks[0].dp_cp_group, into=[piece for _, piece in mine])
        for chunk in self.model_chunks:
            chunk.sync_params_after_step()

    def _copy_model_params_to_main_params(self) -> None:
        for piece, main, _ in self.pieces:
            if is_fp8_param(piece):   # what the bytes stand for, with the weight's 1/scale
                main.data.copy_(piece.float() * main.fp8_param.fp8_scale_inv)
            elif main is not piece:
                main.data.copy_(piece)

    @torch.no_grad()
    def reload_fp8_params(self) -> None:
        """After a checkpoint is loaded: the fp8 weights cast again from the fp32 main pieces,
        their slots started afresh (the distributed optimizer's rule, distrib_optimizer.py)."""
        for param in self.fp8_params:
            fresh = param.fp8_meta
            fresh.scale = torch.ones_like(fresh.scale)
            if hasattr(fresh, "history"):
                fresh.history = torch.zeros_like(fresh.history)
        self._copy_main_params_to_model_params()

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
