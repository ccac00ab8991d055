"""What torch's FSDP2 (--use-torch-fsdp2) holds and sends per rank, from the arguments alone.

The units are core/distributed/torch_fully_sharded_data_parallel.py's: the embedding, each
transformer layer, and the root (the final norm and the output layer). FSDP2 cuts each
*parameter* by rows (dim 0) into dp chunks of c = ceil(rows/dp) rows, as torch.chunk does, and
pads every rank's chunk to c rows; a unit's shard is its parameters' padded chunks end to end,
and that is what its all-gather hands in. Per rank (e bytes per element):

    params      the padded chunks of every parameter, plus the units gathered at the peak
    grads       each unit's reduce-scatter output (its padded shard), kept as the gradients
    optimizer   Adam's two fp32 moments (and a 16-bit model's fp32 main copy) of the rows the
                rank owns, unpadded: torch's zeros_like of a DTensor is its local rows

FSDP2 reduces in the parameters' dtype (Megatron gives it no mixed-precision policy), so a bf16
model's gradients are bf16 here whatever --accumulate-allreduce-grads-in-fp32 says.

The peak: the root is gathered first and stays whole through forward; each other unit is
gathered just before its forward and freed after it. An all-gather lands in a flat buffer
(the unit whole) that FSDP2 copies into the parameters and keeps until the *next* all-gather
is issued (its last-gather state, which orders reuse of the memory on a GPU's streams). So at
each gather a rank holds the root, and the flat outputs of two units in forward order; the
largest of these moments, measured on the gloo ranks, comes in forward (tests/test_torch_fsdp2.py
samples every gather and reduction of a step). In backward it holds the root, at most one
layer whole and two gathers, less in the models measured. With
--torch-fsdp2-no-reshard-after-forward nothing is freed until backward: at each gather every
unit gathered before it is whole.
Torch-free, like the rest of the estimator.
"""

from __future__ import annotations

import re

from minitron.training.theoretical_params import DTYPE_BYTES, model_params, num_microbatches, optimizer_moments

_LAYER = re.compile(r"^(.*?layers\.\d+)\.")
EMBEDDING, ROOT = "embedding", "(root)"
# Row-parallel weights are [hidden, input/tp]; the other 2-D weights are [output/tp, hidden].
_ROW_PARALLEL = ("linear_proj.weight", "linear_fc2.weight")
_COLUMN_SHAPED = ("word_embeddings.weight", "position_embeddings.weight", "linear_qkv.weight",
                  "linear_fc1.weight", "output_layer.weight")


def _rows(name: str, numel: int, h: int) -> int:
    """Dim 0 of a parameter: what FSDP2 cuts."""
    if name.endswith(_ROW_PARALLEL):
        return h
    if name.endswith(_COLUMN_SHAPED):
        return numel // h
    return numel   # norms and biases: one dimension


def torch_fsdp2_units(args) -> dict[str, list[tuple[int, int]]]:
    """unit -> [(rows, elements per row)] of its parameters: the embedding, the layers, the root."""
    units: dict[str, list] = {}
    for p in model_params(args, 0, 0):
        layer = _LAYER.match(p.name)
        unit = layer.group(1) if layer else EMBEDDING if p.name.startswith("embedding.") else ROOT
        rows = _rows(p.name, p.numel, args.hidden_size)
        units.setdefault(unit, []).append((rows, p.numel // rows))
    if ROOT in units:
        units[ROOT] = units.pop(ROOT)   # the root last, as the wrapper lists it
    return units


def _dp(args) -> int:
    return args.data_parallel_size * args.context_parallel_size


def unit_shards(args) -> dict[str, int]:
    """unit -> elements of this rank's padded shard (what its all-gather hands in)."""
    dp = _dp(args)
    return {name: sum(-(-rows // dp) * width for rows, width in params)
            for name, params in torch_fsdp2_units(args).items()}


def _peak_gathered(args, shards: dict[str, int]) -> int:
    """Elements held whole at the peak, beyond the shards (see the module docstring): at the
    gather of each unit in forward order, the units whole by then, and the flat outputs of this
    gather and the one before it."""
    dp = _dp(args)
    whole = {name: n * dp for name, n in shards.items()}
    root = whole.pop(ROOT, 0)
    order = [root, *whole.values()]   # forward: the root, the embedding, the layers
    peak = root
    for k in range(1, len(order)):
        held = root if args.torch_fsdp2_reshard_after_forward else sum(order[:k])   # copied out by now
        peak = max(peak, held + order[k - 1] + order[k])
    return peak


def torch_fsdp2_memory(args, dp_rank: int) -> tuple[int, dict]:
    """(parameters of the model chunk, {"params", "grads", "optimizer"} bytes) on ``dp_rank``."""
    dp, e = _dp(args), DTYPE_BYTES[args.params_dtype]
    main_copy = 4 if e != 4 else 0   # a 16-bit model is stepped through fp32 main copies
    units = torch_fsdp2_units(args)
    shards = unit_shards(args)
    owned = 0
    for params in units.values():
        for rows, width in params:
            c = -(-rows // dp)
            owned += max(0, min(rows, (dp_rank + 1) * c) - dp_rank * c) * width
    numel = sum(rows * width for params in units.values() for rows, width in params)
    params = sum(shards.values()) + _peak_gathered(args, shards)
    return numel, {"params": params * e, "grads": sum(shards.values()) * e,
                   "optimizer": owned * (4 * optimizer_moments(args) + main_copy)}


def torch_fsdp2_comm(args, tally) -> None:
    """Add one train_step's FSDP2 collectives to ``tally`` (bytes each rank hands in, times
    calls): per micro-batch, each unit's all-gather before forward and again before backward
    (once, with --torch-fsdp2-no-reshard-after-forward) and its reduce-scatter after backward."""
    dp, e, m = _dp(args), DTYPE_BYTES[args.params_dtype], num_microbatches(args)
    gathers = 2 if args.torch_fsdp2_reshard_after_forward else 1
    for shard in unit_shards(args).values():
        tally.add("dp-cp", shard * e, m * gathers)
        tally.add("dp-cp", shard * dp * e, m)
    # finalize_model_grads: the sequence-parallel norms' and biases' rows, summed over tp (one
    # vector each; a rank's rows, counted as ceil(n/dp): exact where dp divides them)
    sp_rows = sum(-(-p.numel // dp) for p in model_params(args, 0, 0) if p.sequence_parallel)
    if sp_rows:
        tally.add("tp", sp_rows * e)
    if args.clip_grad > 0:   # the gradient norm: the local rows' sum over dp, then over tp x pp
        tally.add("dp-cp", 4)
        tally.add("tp-pp", 4)
    tally.add("dp-cp", 8)   # train_step's loss: [sum, tokens], summed over dp x cp
