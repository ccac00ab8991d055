"""--recompute-num-layers against an uneven pipeline split (issue #36). Megatron's recompute.py
applies N to the layers each model chunk holds, a smaller stage recomputing all of its own, so
the bound is the fullest pipeline stage of the split actually built, not num_layers // pp."""

import pytest

from minitron.training.arguments import ArgumentError, build_parser, validate_args


def _validated(layers, pp, n, *flags):
    args = build_parser().parse_args(["--num-layers", str(layers), "--hidden-size", "32", "--num-attention-heads",
                                      "4", "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size",
                                      "4", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
                                      "--pipeline-model-parallel-size", str(pp), "--recompute-granularity", "full",
                                      "--recompute-method", "block", "--recompute-num-layers", str(n), *flags])
    args.world_size, args.rank = pp, 0
    return validate_args(args)


# (layers, pp, split flags, the fullest stage): the old bound, layers // pp, was 2, 2, 2 and 4
@pytest.mark.parametrize("layers,pp,flags,most", [
    (5, 2, ["--decoder-first-pipeline-num-layers", "1"], 4),
    (6, 3, ["--decoder-last-pipeline-num-layers", "4"], 4),
    (4, 2, ["--pipeline-model-parallel-layout", "Et|t*3L"], 3),
    (8, 2, ["--pipeline-model-parallel-layout", "Et|t*3|t*3|tL"], 4),   # vp 2: rank 1 holds 3 + 1
])
def test_the_bound_is_the_fullest_stage(layers, pp, flags, most):
    assert _validated(layers, pp, most, *flags).recompute_num_layers == most
    with pytest.raises(ArgumentError) as err:
        _validated(layers, pp, most + 1, *flags)
    assert f"between 1 and the {most} layers of the fullest pipeline stage" in str(err.value)
    assert "\n" not in str(err.value)


def test_an_even_split_keeps_megatron_s_layers_per_rank():
    _validated(8, 2, 4, "--num-virtual-stages-per-pipeline-rank", "2")   # 2 chunks of 2: a rank holds 4
    with pytest.raises(ArgumentError, match="between 1 and the 4 layers"):
        _validated(8, 2, 5)


def test_transformer_config_applies_the_same_bound():
    from minitron.core.transformer import TransformerConfig
    shape = dict(num_layers=5, hidden_size=8, num_attention_heads=2, pipeline_model_parallel_size=2,
                 num_layers_in_last_pipeline_stage=4, recompute_granularity="full", recompute_method="uniform")
    assert TransformerConfig(**shape, recompute_num_layers=4).recompute_num_layers == 4
    with pytest.raises(ValueError, match="between 1 and the 4 layers of the fullest pipeline stage, got 5"):
        TransformerConfig(**shape, recompute_num_layers=5)
