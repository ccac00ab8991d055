"""What stage 3 sends per train_step with ZeRO++ (runtime/zero/zeropp.py and
runtime/comm/coalesced_collectives.py), for ``minitron estimate`` and the tests that hold it
against a trace. No torch: the estimator runs without it.

Bytes are what a rank hands to each call (its input: cli/views/diff.py's call_bytes), by group:

    gather, plain      my pieces of the module's parameters, e bytes each, on the dp group
    gather, hpZ        the secondary pieces, dp/h times larger, on the h-rank group inside the
                       node; the first forward after a step still gathers from all dp ranks
                       (the step dropped the secondary pieces), every other gather does not
    gather, qwZ        1 byte an element (int8) and a 4-byte scale per block: two calls
    gradient, plain    the whole gradient padded to dp pieces (reduce-scatter), e bytes each
    gradient, qgZ      a matrix: n/2 bytes of int4 and 4 per block inside the node, then
                       n/(2L) and 4 per block / L between nodes; 1-D ones reduce-scatter

``minitron estimate`` counts an iteration after the first: under hpZ the run's first forward
finds the secondary pieces that initialization cut and gathers inside the node (``first_step``
counts that one, for the tests).
"""

from __future__ import annotations

import math

from minitron.ops.quantizer.groups import gradient_groups, qgz_applies, weight_groups

INTRA, QGZ_LOCAL, QGZ_GLOBAL = "ZERO_PARAM_INTRA_PARALLEL_GROUP", "QGZ_LOCAL", "QGZ_GLOBAL"


def zeropp(cfg) -> bool:
    """Does this ds_config (a DeepSpeedConfig) ask stage 3 for hpZ or qwZ? qgZ is not estimated
    for a model: its bytes depend on each matrix's shape, which the estimator's parameter lists
    do not carry (validate_zeropp refuses it before the estimate starts)."""
    z3 = cfg.zero_config.stage3
    return z3.zero_hpz_partition_size > 1 or z3.zero_quantized_weights


def unestimated(cfg) -> str | None:
    """What the estimate cannot count in this ds_config, as the refusal's line, or None."""
    z3 = cfg.zero_config.stage3
    if cfg.zero_optimization_stage != 3:
        return None
    if z3.zero_quantized_gradients:
        return ("zero_quantized_gradients: estimate does not count qgZ's all-to-alls for a model (they depend on "
                "each matrix's shape); run the job with --trace to measure them, or drop the key")
    knobs = {"stage3_param_persistence_threshold": z3.param_persistence_threshold,
             "stage3_prefetch_bucket_size": z3.prefetch_bucket_size, "stage3_max_reuse_distance": z3.max_reuse_distance}
    for key, value in knobs.items():
        if value:
            return (f"{key}: estimate counts stage 3's gathers module by module and does not follow the "
                    "coordinator's trace; set it to 0 for the estimate, or run the job with --trace")
    return None


def _gather(tally, elems: int, key: str, e: int, quantized: bool, calls: int) -> None:
    if quantized:
        tally.add(key, elems, calls)                          # int8 codes
        tally.add(key, 4 * weight_groups(elems), calls)       # fp32 scales
    else:
        tally.add(key, elems * e, calls)


def stage3_comm(tally, modules: list[list[int]], grads: list[tuple], *, dp: int, e: int, m: int, dp_key: str,
                hpz: int = 1, quantized_weights: bool = False, quantized_gradients: bool = False,
                local: int | None = None, first_step: bool = False, again: int = 0) -> None:
    """Stage 3's gathers and gradient reductions in one train_step of ``m`` micro-batches.
    ``modules``: per module, the piece (elements) of each parameter it gathers; ``grads``: the
    shape of every gradient; ``again``: modules' gathers repeated before backward (recomputed
    layers, the tied embedding read by the output layer), given as extra entries of ``modules``
    counted once per micro-batch. ``first_step``: the run's first train_step, whose first forward
    finds the secondary pieces that initialization cut."""
    for k, pieces in enumerate(modules):
        elems = sum(pieces)
        secondary = elems * dp // hpz
        passes = 1 if k >= len(modules) - again else 2   # forward and backward, or one extra gather
        if hpz > 1:
            from_all = 0 if first_step or passes == 1 else 1   # the first forward after a step
            _gather(tally, elems, dp_key, e, quantized_weights, from_all)
            _gather(tally, secondary, INTRA, e, quantized_weights, passes * m - from_all)
        else:
            _gather(tally, elems, dp_key, e, quantized_weights, passes * m)
    world = dp
    local = local or world
    for shape in grads:
        numel = math.prod(shape)
        if quantized_gradients and world > local and qgz_applies(shape, world):
            blocks = gradient_groups(shape, world)
            tally.add(QGZ_LOCAL, numel // 2, m)
            tally.add(QGZ_LOCAL, 4 * blocks, m)
            tally.add(QGZ_GLOBAL, numel // (2 * local), m)
            tally.add(QGZ_GLOBAL, 4 * (blocks // local), m)
        else:
            tally.add(dp_key, -(-numel // dp) * dp * e, m)
