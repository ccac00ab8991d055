"""ZeRO: stages 0-2 in stage_1_and_2.py (flat buffers cut into data-parallel partitions),
stage 3 in stage3.py (each parameter cut, gathered per module), and where partitions start
(alignment.py, which the estimator reads without torch: so this package imports no stage until
one is asked for)."""


def register_external_parameter(module, parameter):
    """``deepspeed.zero.register_external_parameter``: see stage3.py."""
    # Lazy: the stages need torch; `minitron estimate` imports this package for alignment.py alone.
    from minitron.runtime.zero.stage3 import register_external_parameter as register
    return register(module, parameter)
