"""Multi-token prediction (--mtp-num-layers) in minitron's default suite; test_mcore_mtp.py
holds it to Megatron-Core's own MTP.

1. pretrain_gpt with two MTP depths, every layer an MoE layer (the MTP ones too) routed as in
   DeepSeek-V3 (sigmoid scores, the expert bias, group-limited top-2), trains like its serial self, per-iteration lm loss, each depth's logged MTP
   loss and the balance loss (decoder and MTP routers) within 1e-5: at pipeline parallel 2,
   where the MTP layers and a copy of the embedding live on the last stage (kept equal to the
   first stage's, the output layer tied to it), and at tensor (sequence) x expert parallel 2.
2. The estimate's parameter list (theoretical_params.model_params) is what the last stage
   registers at pp 2 x tp 2, name for name and size for size (the embedding's copy, the MTP
   layers, no output weight of its own when tied), and total_params counts the serial model's.
3. Refusals: one line each.
"""

from pathlib import Path

import pytest
from distributed import pretrain_records, run_ranks
from test_estimate import estimate_args

from minitron.training.arguments import ArgumentError, build_parser, validate_args
from minitron.training.theoretical_params import model_params, total_params

MODEL = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
         "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-2",
         "--mock-data", "--vocab-size", "127", "--make-vocab-size-divisible-by", "32",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7", "--distributed-backend", "gloo",
         "--position-embedding-type", "rope", "--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.3",
         "--num-experts", "4", "--moe-aux-loss-coeff", "1e-2", "--moe-token-dispatcher-type", "alltoall",
         "--disable-bias-linear", "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
         "--moe-router-num-groups", "2", "--moe-router-group-topk", "1"]
KEYS = ("lm_loss", "mtp_1_loss", "mtp_2_loss", "load_balancing_loss")


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return pretrain_records(tmp_path_factory.mktemp("mtp") / "serial", 1, MODEL)


@pytest.mark.parametrize("name, flags", [("pp2", ["--pipeline-model-parallel-size", "2"]),
                                         ("tp2-sp-ep2", ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                                         "--expert-model-parallel-size", "2",
                                                         "--expert-tensor-parallel-size", "1"])])
def test_mtp_layout_matches_serial(tmp_path, monkeypatch, serial, name, flags):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    layout = pretrain_records(tmp_path / name, 2, MODEL + flags)
    for key in KEYS:
        ours, theirs = [r[key] for r in layout], [r[key] for r in serial]
        assert ours == pytest.approx(theirs, abs=1e-5), f"{name} {key}: {ours} vs serial {theirs}"
    assert serial[1]["mtp_1_loss"] != serial[0]["mtp_1_loss"]


def _registered(rank, args):
    """(this stage's parameters other than the decoder's layers as the model registers them and
    as the estimate lists them, equal?; the lists; its total equal to the estimate's?)"""
    from minitron.core import parallel_state
    from minitron.core.models.gpt import GPTModel
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.training.arguments import core_transformer_config_from_args

    model_parallel_cuda_manual_seed(1)
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    first, last = pp_rank == 0, pp_rank == args.pipeline_model_parallel_size - 1
    model = GPTModel(core_transformer_config_from_args(args), args.padded_vocab_size, args.max_position_embeddings,
                     pre_process=first, post_process=last, position_embedding_type="rope",
                     share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights)
    # (the estimate numbers decoder layers over the whole model, a stage's module from 0)
    held = sorted((n, p.numel()) for n, p in model.named_parameters() if not n.startswith("decoder.layers."))
    listed = model_params(args, pp_rank, 0)
    estimated = sorted((p.name, p.numel) for p in listed if not p.name.startswith("decoder.layers."))
    total = sum(p.numel() for p in model.parameters())
    return held == estimated, held, estimated, total, total == sum(p.numel for p in listed)


def test_estimated_parameters_are_the_models():
    argv = MODEL[:MODEL.index("--distributed-backend")] + MODEL[MODEL.index("--position-embedding-type"):]
    layout = ["--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"]
    args, serial_args = estimate_args(4, *argv, *layout), estimate_args(1, *argv)   # parsed before the fork
    ranks = run_ranks(lambda rank: _registered(rank, args), world_size=4, tp=2, pp=2)
    for same, held, estimated, _, total_same in ranks:
        assert same and total_same, (set(held) ^ set(estimated))
    assert any(name.startswith("mtp.layers.1.mtp_model_layer.mlp.experts") for name, _ in ranks[-1][1])
    same, _, _, total, _ = run_ranks(lambda rank: _registered(rank, serial_args), world_size=1)[0]
    assert same and total == total_params(serial_args)


@pytest.mark.parametrize("flags, words", [
    (["--position-embedding-type", "learned_absolute"], "needs --position-embedding-type rope or none"),
    (["--context-parallel-size", "2"], "does not run with --context-parallel-size > 1"),
    (["--deepspeed", "--deepspeed-config", str(Path(__file__).parent.parent / "docs/examples/ds_config_pretrain.json")],
     "--mtp-num-layers with --deepspeed"),
])
def test_mtp_refusals(flags, words):
    base = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
            "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--mtp-num-layers", "1",
            "--position-embedding-type", "rope", "--tokenizer-type", "NullTokenizer", "--vocab-size", "64"]
    args = build_parser().parse_args(base + flags)
    args.world_size, args.rank = 2, 0
    with pytest.raises(ArgumentError, match=words.replace("-", r"\-")):
        validate_args(args)
