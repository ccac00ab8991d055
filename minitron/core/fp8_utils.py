"""Where fp8 training is switched on, and which tensors it quantizes (Megatron's fp8_utils.py).

Megatron does not quantize anything itself: its ``get_fp8_context`` opens Transformer Engine's
``fp8_autocast`` with the recipe the flags describe (``get_fp8_recipe``) and the amax
reduction group, and the TE linear layers created by the transformer layer spec quantize
their GEMM inputs while the context is open. The TransformerBlock opens it around its layers,
so the linears *inside* the transformer layers run in fp8 and the output layer (a plain
ColumnParallelLinear, outside the block) stays in the training dtype.

minitron does the same with its own layers: inside ``get_fp8_context`` a Column- or
RowParallelLinear asks ``fp8_quantizers(self)`` for its three tensor slots (input, weight,
gradient of the output) and multiplies through core/fp8/linear.py; outside it, the answer is
None and the layer's path is the one it always was. The slots live on the layer as a plain
attribute (not in its state_dict: TE keeps its scales in an ``_extra_state`` entry of the
checkpoint, minitron does not, so a resumed run starts its amax histories afresh).

The amax reduction group is Megatron's ``get_amax_reduction_group(with_context_parallel=True)``:
the tensor-, data- and context-parallel ranks of one pipeline stage. Every rank of a layout
then sees the amax the serial model would see, so delayed scales agree across layouts.

MoE experts (moe/experts.py, experts_grouped.py) quantize as the dense linears do, each expert
with slots of its own. Megatron hands them the same group: TE reduces the amaxes of all its
slots in one all-reduce, position by position, so with expert parallelism local expert i of
one rank shares its delayed scales with local expert i of every other (experts i, i + E/ep,
... take the max of their amaxes); only at ep 1 is every expert's scale its own. minitron's
slots reduce one by one in the same order, which pairs them the same way.
"""

from __future__ import annotations

import contextlib

from minitron.core import parallel_state
from minitron.core.fp8.recipes import CurrentScaling, DelayedScaling, MXScaling, formats_for

# the three of Megatron's --fp8-recipe choices built here (validate_fp8 refuses the others by name)
BUILT_RECIPES = ("delayed", "tensorwise", "mxfp8")
ROLES = ("input", "weight", "grad_output")

_active_config = None   # the config of the innermost open fp8 context, or None


def get_amax_reduction_group():
    """Megatron's get_amax_reduction_group(with_context_parallel=True): tp x dp x cp."""
    return parallel_state.get_tensor_and_data_parallel_group(with_context_parallel=True)


def get_fp8_recipe(config):
    """A factory for one tensor slot of the recipe the config names: role -> quantizer."""
    if config.fp8_recipe not in BUILT_RECIPES:
        raise ValueError(f"fp8 recipe {config.fp8_recipe!r} is not built in minitron")
    fmts = formats_for(config.fp8)
    if config.fp8_recipe == "tensorwise":
        return lambda role: CurrentScaling(fmts[role])
    if config.fp8_recipe == "mxfp8":
        return lambda role: MXScaling(fmts[role])
    group = get_amax_reduction_group() if parallel_state.model_parallel_is_initialized() else None
    return lambda role: DelayedScaling(fmts[role], config.fp8_amax_history_len,
                                       config.fp8_amax_compute_algo, config.fp8_margin, group)


@contextlib.contextmanager
def get_fp8_context(config):
    """Quantize the linears called inside (TE's fp8_autocast, as Megatron opens it); a no-op
    when the config does not ask for fp8."""
    global _active_config
    if not getattr(config, "fp8", None):
        yield
        return
    outer, _active_config = _active_config, config
    try:
        yield
    finally:
        _active_config = outer


def fp8_quantizers(layer, num_gemms: int | None = None) -> dict | list | None:
    """The layer's slots {role: quantizer} inside an fp8 context, made on first use; else None.
    Every rank of the amax group reaches its layers in the same order, so slots made lazily
    still pair up across ranks for the reductions. ``num_gemms``: a list of that many sets,
    one per GEMM of a grouped linear (TE's GroupedLinear keeps an input, weight and gradient
    scale per GEMM: each local expert its own)."""
    if _active_config is None:
        return None
    slots = layer.__dict__.get("_fp8_quantizers")
    if slots is None:
        make = get_fp8_recipe(_active_config)
        sets = [{role: make(role) for role in ROLES} for _ in range(num_gemms or 1)]
        slots = layer.__dict__["_fp8_quantizers"] = sets if num_gemms else sets[0]
    return slots
