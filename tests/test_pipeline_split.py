"""Uneven pipeline splits, as Megatron-Core 0.19.2 assigns layers to stages: the first/last stage
sizes, the embedding/loss counted as layers, and the layout string. Each must build the serial
model (same losses) with global layer numbers (same checkpoint keys)."""

import pytest

from distributed import pretrain_records, run_ranks

from minitron.core.pipeline_parallel.layer_layout import layer_counts, parse_layout, stage_layers
from minitron.training.arguments import ArgumentError, build_parser, validate_args


# (num_layers, pp, vp, split flags) -> layers per virtual stage, i = chunk * pp + rank, worked out
# by Megatron's get_num_layers_to_build / get_transformer_layer_offset rules.
@pytest.mark.parametrize("args,kw,counts", [
    ((3, 2, None), dict(first=1), [1, 2]),
    ((7, 3, None), dict(last=1), [3, 3, 1]),
    ((10, 3, 2), dict(first=2, last=4), [1, 2, 2, 1, 2, 2]),     # middle rank: 4 layers, 2 per chunk
    ((6, 4, None), dict(embedding=True, loss=True), [1, 2, 2, 1]),
    ((6, 2, 2), dict(embedding=True, loss=True), [1, 2, 2, 1]),
    ((6, 2, None), dict(layout="Et*3|t*3L"), [3, 3]),
    ((3, 2, None), dict(layout="E|t|t|tL"), [0, 1, 1, 1]),        # a stage holding only the embedding
])
def test_layer_counts(args, kw, counts):
    assert layer_counts(*args, **kw) == counts


def test_offsets_are_prefix_sums_in_visiting_order():
    counts = layer_counts(10, 3, 2, first=2, last=4)
    # Megatron's offset for rank 2, chunk 1: 5 layers per chunk round, + 1 (first) + 2 (middle) = 8.
    assert stage_layers(counts, 3, pp_rank=2, vp_stage=1) == range(8, 10)
    assert [stage_layers(counts, 3, 0, c) for c in (0, 1)] == [range(0, 1), range(5, 6)]


def test_parse_layout_unrolls_as_megatron():
    assert parse_layout("Ettt|(tt|)*2,m|L") == [list("Ettt"), list("tt"), list("tt"), list("m"), list("L")]
    assert parse_layout("Et*3|t*3L") == [list("Ettt"), list("tttL")]


def _validated(world, pp, *flags, layers=4):
    args = build_parser().parse_args(["--num-layers", str(layers), "--hidden-size", "32", "--num-attention-heads",
                                      "4", "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size",
                                      "4", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
                                      "--pipeline-model-parallel-size", str(pp), *flags])
    args.world_size, args.rank = world, 0
    return validate_args(args)


@pytest.mark.parametrize("layers,pp,flags,says", [
    (4, 3, ["--decoder-first-pipeline-num-layers", "1"], "3 layers left for the 2 middle pipeline ranks"),
    (4, 2, ["--decoder-first-pipeline-num-layers", "1", "--account-for-loss-in-pipeline-split"], "give one"),
    (4, 2, ["--decoder-first-pipeline-num-layers", "1", "--num-virtual-stages-per-pipeline-rank", "2"],
     "divisible by the 2 model chunks"),
    (4, 2, ["--account-for-embedding-in-pipeline-split"], "= 5 does not split"),
    (4, 2, ["--pipeline-model-parallel-layout", "Et*2|t|tL"], "not a multiple of --pipeline-model-parallel-size 2"),
    (4, 2, ["--pipeline-model-parallel-layout", "Et*2|t*2mL"], "only with --mtp-num-layers"),
    (4, 2, ["--pipeline-model-parallel-layout", "Et*2|t*2xL"], "unknown layer 'x'"),
    (4, 2, ["--pipeline-model-parallel-layout", "Et*2|t*3L"], "places 5 transformer layers"),
])
def test_bad_splits_are_refused_in_one_line(layers, pp, flags, says):
    with pytest.raises(ArgumentError) as err:
        _validated(pp, pp, *flags, layers=layers)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_layout_sets_the_virtual_pipeline():
    assert _validated(2, 2, "--pipeline-model-parallel-layout", "E|t*2|t|tL").virtual_pipeline_model_parallel_size == 2


def _block_keys(rank):
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.core.transformer import TransformerConfig
    from minitron.core.transformer.transformer_block import TransformerBlock
    config = TransformerConfig(num_layers=3, hidden_size=8, num_attention_heads=2, pipeline_model_parallel_size=2,
                               num_layers_in_first_pipeline_stage=1)
    model_parallel_cuda_manual_seed(1)
    block = TransformerBlock(config, post_process=False)
    rows = [(v.key, v.global_offset[0]) for v in block.sharded_state_dict("decoder.").values()
            if v.key.endswith("self_attention.linear_proj.weight")]
    return [layer.layer_number for layer in block.layers], rows


def test_layer_numbers_and_checkpoint_keys_stay_global():
    (first, k0), (last, k1) = run_ranks(_block_keys, world_size=2, tp=1, pp=2)
    assert first == [1] and last == [2, 3]
    # one key for the stack; each stage's layers land at their global rows of it
    key = "decoder.layers.self_attention.linear_proj.weight"
    assert k0 == [(key, 0)] and k1 == [(key, 1), (key, 2)]


MODEL = ["--num-layers", "3", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-2", "--mock-data",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--distributed-backend", "gloo"]


def test_uneven_pipelines_train_the_serial_model(tmp_path):
    serial = pretrain_records(tmp_path / "serial", 1, MODEL)
    # pp 2 with the first stage holding 1 of 3 layers
    uneven = pretrain_records(tmp_path / "first1", 2, MODEL + ["--pipeline-model-parallel-size", "2",
                                                                "--decoder-first-pipeline-num-layers", "1"])
    # a layout with 2 chunks per rank, the first of them holding only the embedding
    layout = pretrain_records(tmp_path / "layout", 2, MODEL + [
        "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "E|t|t|tL",
        "--microbatch-group-size-per-virtual-pipeline-stage", "4"])
    for run in (uneven, layout):
        for a, b in zip(serial, run):
            assert b["lm_loss"] == pytest.approx(a["lm_loss"], rel=1e-6)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    assert len(serial) == len(uneven) == len(layout) == 2


def test_the_estimate_follows_the_split():
    from minitron.training.theoretical_params import chunk_layers
    args = _validated(2, 2, "--decoder-first-pipeline-num-layers", "1", layers=3)
    assert [chunk_layers(args, r, 0) for r in (0, 1)] == [range(0, 1), range(1, 3)]
    args = _validated(2, 2, "--pipeline-model-parallel-layout", "E|t|t|tL", layers=3)
    assert [chunk_layers(args, r, c) for c in (0, 1) for r in (0, 1)] == [range(0, 0), range(0, 1), range(1, 2),
                                                                           range(2, 3)]
