"""The cases tests/test_ds_zeropp.py, its DeepSpeed peer and scripts/show_zeropp.py run
(tests/zeropp_runs.py runs them): no torch here, so that the script's tables print without it.

4 ranks faked as 2 nodes of 2 (hpZ's partition size; LOCAL_SIZE, which qgZ reads as DeepSpeed's
CPU accelerator does), two Adam steps of one micro-batch per rank on a three-linear net."""

WORLD, NODE, STEPS, IN = 4, 2, 2, 32
RUN, STEP, BACKWARD = "zeropp.run", "zeropp.step", "zeropp.backward"
MOVES = tuple(f"torch.distributed.{name}" for name in ("all_gather_into_tensor", "reduce_scatter_tensor",
                                                          "all_to_all_single"))
# Every ZeRO++ run and plain ZeRO-3 beside them: the stage-3 knobs off, so that each gathers
# module by module and the differences are ZeRO++'s alone.
PLAIN = {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0,
         "stage3_max_reuse_distance": 0}
CASES = {
    "zero3": PLAIN,
    "hpz": {**PLAIN, "zero_hpz_partition_size": NODE},
    "qwz": {**PLAIN, "zero_quantized_weights": True},
    "qgz": {**PLAIN, "zero_quantized_gradients": True},
    "zeropp": {**PLAIN, "zero_hpz_partition_size": NODE, "zero_quantized_weights": True,
               "zero_quantized_gradients": True},
    # stage 3's knobs, one at a time, against zero3
    "persist": {**PLAIN, "stage3_param_persistence_threshold": 64},   # the biases (64, 32, 32)
    "prefetch": {**PLAIN, "stage3_prefetch_bucket_size": 2048 + 64},  # about one linear's weight and bias
    "reuse": {**PLAIN, "stage3_max_reuse_distance": 1_000_000_000},   # DeepSpeed's default
}


def shapes_by_module() -> list:
    """The net's parameter shapes, module by module, in the order stage 3 gathers them."""
    return [[(64, IN), (64,)], [(IN, 64), (IN,)], [(IN, IN), (IN,)]]
