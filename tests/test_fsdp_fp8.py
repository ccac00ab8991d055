"""Megatron-FSDP with --fp8-param-gather on 2 forked gloo ranks (dp 2): a bf16 GPT (2 layers,
hidden 32) whose 8 quantized linear weights are fp8, 3 Adam steps with gradient clipping on
one seeded micro-batch a step, fp8 hybrid with delayed scaling (history 16, "max"):

* optim_grads_params (Megatron-FSDP's default), the same built on the meta device, and optim
  give the distributed optimizer's --fp8-param-gather losses to 1e-6 relative. Not promised bit
  for bit: the fp8 weights are units of their own here and one buffer there, so the shards cut the
  parameters elsewhere, the gradient norm's squares are summed in another order, and the clip
  factor (every updated weight with it) may differ in fp32's last bit (measured: the losses
  bit-equal, the norms 1.5e-7 relative apart; without clipping the losses are bit-equal too);
* the fp8 weights each rank holds after the steps have the distributed optimizer's run's
  1/scales, and its bytes but for at most one in a thousand that is the next fp8 value (that
  last fp32 bit of the clip factor, rounded once more; measured: 1 of 24,576 bytes);
* each layer's fp8 weights are gathered as a unit of their own, in one byte an element: read
  off the traced collectives, the unit's all-gather hands uint8, its shard's numel in bytes;
* the refusals Megatron makes with the flag, in one line (validated before any rank starts).
"""

from __future__ import annotations

import pytest
import torch

from distributed import run_ranks, train_chunk
from minitron.cli.views.diff import call_bytes
from minitron.trace.reader import load_trace

VOCAB, SEQ, STEPS = 128, 16, 3
LAYER_FP8 = 3 * 32 * 32 + 32 * 32 + 4 * 32 * 32 + 4 * 32 * 32   # qkv, proj, fc1, fc2 of one layer
GATHER = "torch.distributed.all_gather_into_tensor"
UNIT_GATHER = "minitron.core.distributed.fsdp.unit.FSDPUnit._all_gather"


def _run(layout: str):
    """(losses, the fp8 weights' bytes and 1/scales by name) of one layout's 3 steps."""
    from minitron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from minitron.core.distributed.fsdp import FullyShardedDataParallel, get_fsdp_optimizer
    from minitron.core.fp8.param_gather import is_fp8_param, keep_fp8_params
    from minitron.core.models.gpt import GPTModel
    from minitron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.core.transformer.module import Float16Module
    from minitron.core.transformer.transformer_config import TransformerConfig
    from minitron.training.model_setup import _chunk_builder

    config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, hidden_dropout=0.0,
                               attention_dropout=0.0, params_dtype=torch.bfloat16, fp8="hybrid",
                               fp8_recipe="delayed", fp8_amax_history_len=16, fp8_amax_compute_algo="max",
                               init_seed=5)   # each layer drawn from its own seed: meta builds it alone
    model_parallel_cuda_manual_seed(5)
    build = _chunk_builder(lambda pre_process, post_process, vp_stage: GPTModel(config, VOCAB, SEQ), None)
    meta = layout == "meta"
    model = Float16Module(config, build(keep=(lambda index: False) if meta else None))
    keep_fp8_params(model, config)
    opt = OptimizerConfig(lr=1e-2, bf16=True, use_distributed_optimizer=layout == "distopt", clip_grad=1.0)
    if layout == "distopt":
        chunk = DistributedDataParallel(config, DistributedDataParallelConfig(
            use_distributed_optimizer=True, grad_reduce_in_fp32=True), model)
        optimizer = get_megatron_optimizer(opt, [chunk])
    else:
        strategy = "optim" if layout == "optim" else "optim_grads_params"
        chunk = FullyShardedDataParallel(config, model, strategy, grad_reduce_in_fp32=True,
                                         rebuild=build if meta else None)
        optimizer = get_fsdp_optimizer(opt, [chunk])
    losses = train_chunk(chunk, optimizer, VOCAB, SEQ, 1, STEPS)
    gathered = chunk.gathered() if layout != "distopt" else torch.no_grad()
    with gathered:
        weights = {name: (p.detach().view(torch.uint8).clone(), p.fp8_scale_inv.clone())
                   for name, p in model.named_parameters() if is_fp8_param(p)}
    return losses, weights


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    trace = tmp_path_factory.mktemp("fsdp_fp8") / "trace"
    results = run_ranks(lambda rank: {layout: _run(layout) for layout in ("distopt", "fsdp", "meta", "optim")},
                        world_size=2, trace_dir=str(trace))
    return results, load_trace(trace)[0]


@pytest.mark.parametrize("layout", ["fsdp", "meta", "optim"])
def test_losses_and_fp8_weights_equal_the_distributed_optimizers(runs, layout):
    results, _ = runs
    for rank in (0, 1):   # each rank's losses are its own micro-batch's
        (want, want_weights), (losses, weights) = results[rank]["distopt"], results[rank][layout]
        assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(losses, want)), (rank, losses, want)
        assert losses[-1] < losses[0]   # the weights moved: the casts carried new values
        assert sorted(weights) == sorted(want_weights) and len(weights) == 8   # 4 linears x 2 layers
        data = torch.cat([weights[name][0].view(-1) for name in sorted(weights)]).int()
        want_data = torch.cat([want_weights[name][0].view(-1) for name in sorted(weights)]).int()
        differ = data != want_data   # the clip factor's last bit may round a value to its neighbour
        assert differ.sum() <= data.numel() // 1000 and bool(((data - want_data)[differ].abs() == 1).all())
        assert all(torch.equal(weights[name][1], want_weights[name][1]) for name in weights)   # the 1/scales


def test_fp8_units_gather_one_byte_an_element(runs):
    """Rank 0's trace: the fp8 units' gathers (optim_grads_params: a forward and a backward
    gather per layer a step) hand uint8, half a layer's fp8 weights each; the other units bf16."""
    _, records = runs
    units = [r for r in records if r["name"] == UNIT_GATHER]
    fp8_units = [r for r in units if r["args"]["unit"].endswith("(fp8)")]
    # fsdp and meta run optim_grads_params: 2 layers x (forward + backward) x 3 steps each,
    # and once more to read the weights
    assert len(fp8_units) == 2 * (2 * 2 * STEPS + 2) and all(r["args"]["numel"] == LAYER_FP8 for r in fp8_units)
    gathers = [r for r in records if r["name"] == GATHER]
    fp8 = [r for r in gathers if r["args"].get("dtype") == "uint8"]
    # the distributed optimizer's gathers of its fp8 buffer (a step each), then the units'
    # (fsdp, meta: in forward and backward, a layer's each; optim: after each step, its one fp8
    # unit, both layers' weights, as Megatron buckets optim's parameters by dtype, not by layer)
    distopt, units_fp8 = fp8[:STEPS], fp8[STEPS:]
    assert sorted(map(call_bytes, units_fp8)) == [LAYER_FP8 // 2] * len(fp8_units) + [LAYER_FP8] * STEPS
    assert all(call_bytes(r) == 2 * LAYER_FP8 // 2 for r in distopt)
    assert {r["args"].get("dtype") for r in gathers} == {"uint8", "bfloat16"}


MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--vocab-size", "1023",
         "--bf16", "--use-megatron-fsdp"]


@pytest.mark.parametrize("flags, words", [
    (["--fp8-param-gather"], "--fp8-param-gather needs --fp8-format"),
    (["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8", "--fp8-param-gather"],
     "--fp8-param-gather with --fp8-recipe mxfp8 is refused"),
    (["--fp8-format", "hybrid", "--fp8-param-gather", "--finetune"], "--no-load-optim or --finetune is refused"),
])
def test_refusals_are_one_line(capsys, flags, words):
    from minitron.cli.common import validate_pretrain
    with pytest.raises((Exception, SystemExit)) as refused:
        validate_pretrain(MODEL + flags, 2)
    lines = (capsys.readouterr().err.strip() or str(refused.value)).splitlines()
    assert len(lines) == 1 and words in lines[0], lines


def test_the_flag_is_taken_with_megatron_fsdp():
    from minitron.cli.common import validate_pretrain
    validate_pretrain(MODEL + ["--fp8-format", "hybrid", "--fp8-param-gather", "--init-model-with-meta-device"], 2)
