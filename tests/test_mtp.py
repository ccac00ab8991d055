"""Multi-token prediction (--mtp-num-layers) in minitron's default suite; test_mcore_mtp.py
holds it to Megatron-Core's own MTP.

1. pretrain_gpt with two MTP depths, every layer an MoE layer (the MTP ones too, as in
   DeepSeek-V3), trains like its serial self, per-iteration lm loss, each depth's logged MTP
   loss and the balance loss (decoder and MTP routers) within 1e-5: at pipeline parallel 2,
   where the MTP layers and a copy of the embedding live on the last stage (kept equal to the
   first stage's, the output layer tied to it), and at tensor (sequence) x expert parallel 2.
2. Refusals: one line each.
"""

import pytest
from distributed import pretrain_records

from minitron.training.arguments import ArgumentError, build_parser, validate_args

MODEL = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
         "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-2",
         "--mock-data", "--vocab-size", "127", "--make-vocab-size-divisible-by", "32",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7", "--distributed-backend", "gloo",
         "--position-embedding-type", "rope", "--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.3",
         "--num-experts", "4", "--moe-aux-loss-coeff", "1e-2", "--moe-token-dispatcher-type", "alltoall",
         "--disable-bias-linear"]
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


@pytest.mark.parametrize("flags, words", [
    (["--position-embedding-type", "learned_absolute"], "needs --position-embedding-type rope or none"),
    (["--context-parallel-size", "2"], "does not run with --context-parallel-size > 1"),
])
def test_mtp_refusals(flags, words):
    base = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
            "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--mtp-num-layers", "1",
            "--position-embedding-type", "rope", "--tokenizer-type", "NullTokenizer", "--vocab-size", "64"]
    args = build_parser().parse_args(base + flags)
    args.world_size, args.rank = 2, 0
    with pytest.raises(ArgumentError, match=words.replace("-", r"\-")):
        validate_args(args)
