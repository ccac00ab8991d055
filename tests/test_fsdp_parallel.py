"""Megatron-FSDP combined with model parallelism trains the serial model's numbers (world 4).

Megatron-Core 0.19.2 lets Megatron-FSDP run with tensor, sequence, context, pipeline and expert
parallelism (validate_args refuses none of them; finalize_model_grads sums the local shards of
FSDP's gradients over TP and over the embedding group). Each combination here, at dp 2 (dp 4 for
the MoE model at ep 2), gives the serial run's losses and clipped gradient norms to 1e-5
(relative; measured 1e-7 to 1.6e-6: only the order of the sums differs):

    pp 2              the tied embedding, a unit of its own on both stages, summed piece by piece
    tp 2 + sp + qk    partial layernorm gradients summed over TP on the pieces (fsdp/finalize.py)
    cp 2              the units are cut over dp x cp, as DDP's buffers are
    ep 2 (MoE)        expert units cut over the expert-data-parallel group
    ep 2 + tp 2 + sp  with expert tensor parallel size 1, SwiGLU experts
    dp 4 meta init    --init-model-with-meta-device: each unit built alone, the same weights
                      (an MTP layer too, under its own seed index; and at pp 2 x vp 2, where
                      the tied embedding's copy is summed when the rest of a chunk is built)

The pipeline case runs by default; the others are stress cases (each about two world-4 runs).
"""

from __future__ import annotations

import pytest

from distributed import pretrain_records

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "3", "--lr", "1e-2",
         "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo", "--clip-grad", "1.0"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-token-dispatcher-type", "alltoall"]
TOL = 1e-5


def _curve(records):
    return [(r["lm_loss"], r["grad_norm"]) for r in records]


def _assert_close(curve, serial):
    assert len(curve) == len(serial) == 3
    for (loss, norm), (s_loss, s_norm) in zip(curve, serial):
        assert abs(loss - s_loss) <= TOL * abs(s_loss) and abs(norm - s_norm) <= TOL * s_norm, (curve, serial)


def _serial_then_fsdp(tmp_path, model, parallel):
    serial = _curve(pretrain_records(tmp_path / "serial", 1, model))
    fsdp = _curve(pretrain_records(tmp_path / "fsdp", 4, [*model, "--use-megatron-fsdp", *parallel]))
    _assert_close(fsdp, serial)


def test_pipeline_parallel_with_fsdp_equals_serial(tmp_path):
    _serial_then_fsdp(tmp_path, MODEL, ["--pipeline-model-parallel-size", "2"])


CASES = {
    "tp2-sp-qk": ([*MODEL, "--qk-layernorm"], ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    "cp2": (MODEL, ["--context-parallel-size", "2"]),
    "ep2": ([*MODEL, *MOE], ["--expert-model-parallel-size", "2"]),
    "meta-init": ([*MODEL, "--swiglu", "--mtp-num-layers", "1", "--position-embedding-type", "rope"],
                  ["--init-model-with-meta-device"]),
    "meta-init-pp2-vp2": ([*MODEL, "--num-layers", "4"],
                          ["--init-model-with-meta-device", "--pipeline-model-parallel-size", "2",
                           "--num-layers-per-virtual-pipeline-stage", "1"]),
    "ep2-tp2-sp": ([*MODEL, *MOE, "--swiglu"], ["--expert-model-parallel-size", "2", "--tensor-model-parallel-size",
                                                "2", "--sequence-parallel", "--expert-tensor-parallel-size", "1"]),
}


@pytest.mark.stress
@pytest.mark.parametrize("name", list(CASES))
def test_model_parallel_with_fsdp_equals_serial(tmp_path, name):
    _serial_then_fsdp(tmp_path, *CASES[name])
