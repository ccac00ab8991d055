"""--init-model-with-meta-device: the model is built as shapes, then one unit at a time for real.

Megatron builds the model under ``torch.device("meta")``, so no weight is allocated, and its
Megatron-FSDP allocates each rank's shard and runs each module's reset_parameters to fill it,
one module at a time. Megatron's refill draws new numbers; minitron promises the numbers of the
normal build, so it builds each unit again, alone: every layer draws from a generator seeded
by the run's seed and the layer's index only (core/init_rng.py), so layer n built alone with
every other layer a shape (init_rng.build_on_meta) gets the very numbers the whole model's
build gave it. The unit's real parameters replace the meta ones in the model (the same
constructor made them, with the same marks: tensor-parallel dim, expert, shared), FSDPUnit
copies them into its buffer and keeps this rank's shard, and the rebuilt rest is dropped.

At most one unit exists whole at a time, twice over (the rebuilt parameters and the unit's flat
buffer, which optim_grads_params frees): the build's peak is the shards plus about two of the
largest unit, where the normal build holds the whole model.
"""

from __future__ import annotations

import torch

from minitron.core.fp8.param_gather import is_fp8_param, quantize_param_shard
from minitron.core.transformer.transformer_layer import TransformerLayer


def _strip_wrappers(name: str) -> str:
    while name.startswith("module."):   # Float16Module's .module is no part of the built model's names
        name = name[len("module."):]
    return name


class MetaMaterializer:
    """Real parameters for a chunk built as shapes, one unit at a time, from ``rebuild(keep)``
    (training/model_setup._chunk_builder: the same chunk, built with only what ``keep`` admits)."""

    def __init__(self, module, rebuild):
        self.rebuild = rebuild
        self.owners = {}   # meta parameter -> [(module holding it, attribute)], and its name
        self.names = {}
        for module_name, m in module.named_modules():
            for attr, p in m.named_parameters(recurse=False):
                self.owners.setdefault(p, []).append((m, attr))
                self.names.setdefault(p, _strip_wrappers(f"{module_name}.{attr}" if module_name else attr))
        # Each layer unit's init_rng index: a decoder layer's number; a multi-token-prediction
        # layer's is num_layers + 1 + its depth (multi_token_prediction.py), shared with its
        # block's norms and projection, which the rest of the chunk holds.
        self.index = {}
        for name, m in module.named_modules():
            if isinstance(m, TransformerLayer):
                mtp = name.endswith("mtp_model_layer")
                self.index[m] = m.config.num_layers + 1 + m.layer_number if mtp else m.layer_number
        self.decoder = {self.index[m] for name, m in module.named_modules()
                        if isinstance(m, TransformerLayer) and not name.endswith("mtp_model_layer")}
        self._built = (None, None)   # (which layer index, its rebuilt parameters by name)

    def keep_for(self, module) -> int | None:
        """The index a unit's module was built under (init_rng.layer_init_rng), or None for the
        rest of the chunk: everything built outside the decoder's layers."""
        return self.index.get(module)

    def real(self, params, index: int | None) -> list:
        """``params`` (meta) replaced in the model by the same parameters built for real."""
        if self._built[0] != index or self._built[1] is None:
            decoder = self.decoder
            keep = (lambda i: i == index) if index is not None else (lambda i: i not in decoder)
            self._built = (index, dict(self.rebuild(keep).named_parameters()))
        built = self._built[1]
        out, fp8 = [], []
        for p in params:
            new = built[self.names[p]]
            if is_fp8_param(p):   # --fp8-param-gather: the real weight becomes an fp8 one (below)
                new = self._fp8_like(p, new)
                fp8.append(new)
            elif new.dtype != p.dtype:   # Float16Module cast the shapes; cast the numbers alike
                new.data = new.data.to(p.dtype)
            for m, attr in self.owners[p]:
                setattr(m, attr, new)
            out.append(new)
        # keep_fp8_params left the shapes uncast; each unit's weights are cast as it is built, in
        # the units' order on every rank (their amaxes are reduced together)
        quantize_param_shard(fp8, [q.fp8_init_val.view(-1) for q in fp8], [0] * len(fp8), None)
        return out

    @staticmethod
    def _fp8_like(shape, built):
        """An fp8 parameter with ``shape``'s marks (its weight slot, tensor-parallel dim) and
        ``built``'s numbers in the dtype it stands for, kept for the optimizer's main copy."""
        new = torch.nn.Parameter(torch.empty_like(built, dtype=shape.dtype, device=built.device),
                                 requires_grad=shape.requires_grad)
        new.__dict__.update(shape.__dict__)
        new.fp8_init_val = built.detach().to(shape.fp8_nominal_dtype)
        return new

    def done(self) -> None:
        self._built = (None, None)   # the rebuilt chunk's remains go
