"""MegatronModule, the base of every model part, and Float16Module, the fp16/bf16 wrapper.

MegatronModule only keeps the config, so each layer reads its sizes and switches from one
place instead of a dozen constructor arguments.

Float16Module is what get_model wraps each model chunk in under --fp16 or --bf16, as Megatron
does, between building the chunk and wrapping it for data parallelism. It does three things:

* casts every floating-point parameter and buffer of the chunk to the 16-bit dtype (the layers
  are already built in ``params_dtype``; anything a layer kept in fp32 is caught here). What
  must stay fp32 is kept out of its reach, as in Megatron: rope's ``inv_freq`` is a plain
  attribute, not a buffer (in bf16, positions past 256 would share angles), and the router
  casts its expert bias back before using, loading or saving it;
* on the first pipeline stage, casts fp32 positional *inputs* to that dtype (token ids and
  masks are not floating point and pass untouched; an fp32 tensor handed in from outside
  would otherwise meet 16-bit weights);
* on the last pipeline stage, casts floating-point *outputs* back to fp32, so the loss and
  its reductions are computed in fp32 whatever the model's precision.

Stages in between hand 16-bit activations to each other unchanged: that is half the bytes on
every pipeline send.
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state as mpu
from minitron.core.transformer.utils import module_sharded_state_dict


class MegatronModule(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """Each tensor by its place in the global model (dist_checkpointing; transformer/utils.py)."""
        return module_sharded_state_dict(self, prefix, sharded_offsets, metadata)


_HALF_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def _convert(value, convert):
    """Apply ``convert`` to a tensor, or to each tensor of a (nested) tuple or list."""
    if isinstance(value, (tuple, list)):
        converted = [_convert(v, convert) for v in value]
        return tuple(converted) if isinstance(value, tuple) else converted
    return convert(value) if isinstance(value, torch.Tensor) else value


def fp32_to_float16(value, dtype: torch.dtype):
    """fp32 tensors (and only those) to ``dtype``."""
    return _convert(value, lambda t: t.to(dtype) if t.dtype == torch.float32 else t)


def float16_to_fp32(value):
    """fp16 and bf16 tensors (and only those) to fp32."""
    return _convert(value, lambda t: t.float() if t.dtype in _HALF_DTYPES else t)


class Float16Module(MegatronModule):
    """Run ``module`` in 16 bits: cast it, cast what enters the pipeline, upcast what leaves it."""

    def __init__(self, config, module: torch.nn.Module):
        super().__init__(config)
        dtype = config.params_dtype
        if dtype not in _HALF_DTYPES:
            raise ValueError(f"Float16Module needs params_dtype float16 or bfloat16, got {dtype}: "
                             "wrap a model only under --fp16 or --bf16")
        self.dtype = dtype
        self.fp16, self.bf16 = dtype == torch.float16, dtype == torch.bfloat16
        self.vp_stage = getattr(module, "vp_stage", None)
        # Only floating-point tensors change; integer buffers (positions, counters) keep their type.
        self.add_module("module", module._apply(lambda t: t.to(dtype) if t.is_floating_point() else t))

    def set_input_tensor(self, input_tensor):
        return self.module.set_input_tensor(input_tensor)

    def forward(self, *inputs, fp32_output: bool = True, **kwargs):
        if mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=self.vp_stage):
            inputs = fp32_to_float16(inputs, self.dtype)  # positional inputs, as Megatron
        outputs = self.module(*inputs, **kwargs)
        if fp32_output and mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=self.vp_stage):
            outputs = float16_to_fp32(outputs)
        return outputs

    # A checkpoint holds the wrapped module's keys, with no "module." prefix: the same file then
    # loads into an fp32 model, as in Megatron.
    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True):
        return self.module.load_state_dict(state_dict, strict=strict)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        return self.module.sharded_state_dict(prefix, sharded_offsets, metadata)
