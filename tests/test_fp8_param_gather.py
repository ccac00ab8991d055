"""--fp8-param-gather (core/fp8/param_gather.py) on 2 forked gloo ranks (dp 2), a bf16 GPT with
the distributed optimizer, 3 Adam steps on one seeded batch, fp8 hybrid with delayed scaling
(history 16, "max") and tensorwise:

* the fp8 weight every rank holds after the all-gather is, byte for byte, the full updated
  fp32 main weight rounded to bf16 and cast with the 1/scale kept beside it, though no rank
  saw that main weight whole (each cast its shard; the amaxes were reduced);
* the losses and the fp32 main weights equal those of the same run without the flag, bit for
  bit. Identical by construction, as the module says: the casts see the same bf16 values with
  the same scales (one micro-batch a step: with several, the run without the flag enters the
  weight's amax once per micro-batch, which only changes the scale once the history is full,
  and adds the bf16 weight gradients in bf16 before main_grad, where this adds each in the
  main_grad's dtype). Without gradient clipping: the fp8 weights have a buffer of their own,
  so the dp shards cut the parameters elsewhere and the gradient norm's squares are summed in
  another order; the clip factor, and every updated weight with it, may then differ in fp32's
  last bit (measured with --clip-grad 1: 1.5e-8 at most after 3 steps, losses still equal);
* the step's all-gather moves the fp8 weights in one byte an element: read off the traced
  collectives, the gather of the fp8 buffer is half what the same parameters cost in bf16.
"""

from __future__ import annotations

import torch

from distributed import run_ranks, train_chunk
from minitron.cli.views.diff import call_bytes
from minitron.trace.reader import load_trace

VOCAB, SEQ, STEPS = 128, 16, 3
GATHER = "torch.distributed.all_gather_into_tensor"


def _run(keep_fp8: bool, recipe: str):
    """(losses, full fp32 main weights by name, checks of the gathered fp8 weights)."""
    from minitron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from minitron.core.fp8.param_gather import FP8_WEIGHT, is_fp8_param, keep_fp8_params
    from minitron.core.fp8.recipes import current_scale, quantize
    from minitron.core.models.gpt import GPTModel
    from minitron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.core.transformer.module import Float16Module
    from minitron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, hidden_dropout=0.0,
                               attention_dropout=0.0, params_dtype=torch.bfloat16, fp8="hybrid",
                               fp8_recipe=recipe, fp8_amax_history_len=16, fp8_amax_compute_algo="max")
    model_parallel_cuda_manual_seed(5)
    model = Float16Module(config, GPTModel(config, VOCAB, SEQ))
    if keep_fp8:
        keep_fp8_params(model, config)
    chunk = DistributedDataParallel(config, DistributedDataParallelConfig(
        use_distributed_optimizer=True, grad_reduce_in_fp32=True), model)
    optimizer = get_megatron_optimizer(OptimizerConfig(lr=1e-2, bf16=True, use_distributed_optimizer=True,
                                                                 clip_grad=0.0), [chunk])
    losses = train_chunk(chunk, optimizer, VOCAB, SEQ, 2, STEPS)
    # the whole fp32 main weights, from the shards (each rank contributes its own, zeros elsewhere)
    names = {p: n for n, p in model.named_parameters()}
    mains = {names[p]: torch.zeros(p.numel()) for p in model.parameters()}
    for p, main in zip(optimizer.model_float16_params, optimizer.shard_fp32_from_float16_params):
        start, end = optimizer.param_range_map[p]
        mains[names[p]][start:end] = main.detach()
    for name in sorted(mains):
        torch.distributed.all_reduce(mains[name])
    casts = {}
    for p in (p for p in model.parameters() if is_fp8_param(p)):
        full = mains[names[p]].view(p.shape).to(torch.bfloat16)
        recast = quantize(full, p.fp8_scale, FP8_WEIGHT)
        same_scale = recipe == "delayed" or torch.equal(p.fp8_scale, current_scale(full.abs().amax().float(), FP8_WEIGHT))
        casts[names[p]] = same_scale and torch.equal(recast.view(torch.uint8), p.detach().view(torch.uint8))
    return losses, mains, casts


def test_fp8_param_gather_equals_casting_the_full_main_weight_and_the_run_without_it(tmp_path):
    def body(rank):
        return {recipe: (_run(False, recipe), _run(True, recipe)) for recipe in ("delayed", "tensorwise")}

    results = run_ranks(body, world_size=2, trace_dir=str(tmp_path / "trace"))
    for rank in (0, 1):   # each rank's losses are its own half of the batch's
        for recipe, ((plain_losses, plain_mains, _), (losses, mains, casts)) in results[rank].items():
            assert len(casts) == 8 and all(casts.values()), (rank, recipe, casts)   # 4 linears x 2 layers
            assert losses == plain_losses, (rank, recipe)
            assert all(torch.equal(mains[n], plain_mains[n]) for n in plain_mains), (rank, recipe)

    # the runs' gathers, in order: delayed plain, delayed fp8, tensorwise plain, tensorwise fp8
    gathers = [r for r in load_trace(tmp_path / "trace")[0] if r["name"] == GATHER]
    assert len(gathers) == 2 * (STEPS + 2 * STEPS)   # a gather a step; with the flag two: bf16, fp8 buffers
    plain, fp8 = gathers[:STEPS], gathers[STEPS:3 * STEPS]
    fp8_bytes = sum(call_bytes(r) for r in fp8 if r["args"].get("dtype") == "uint8")
    assert fp8_bytes > 0 and all(r["args"].get("dtype") in ("uint8", "bfloat16") for r in fp8)
    # what the bf16 run gathered less what the fp8 run gathered in bf16: the same weights, in bf16
    bf16_of_them = sum(map(call_bytes, plain)) - sum(call_bytes(r) for r in fp8 if r["args"].get("dtype") != "uint8")
    assert 2 * fp8_bytes == bf16_of_them


def test_estimate_counts_the_one_byte_weights():
    """`minitron estimate`: the 8 quantized weights (2 layers x 12,288 elements, hidden 32) cost
    one byte less each in parameters, and the all-gather hands a rank's half of them in one byte
    instead of two; the amax bytes stay (weights: one packed all-reduce a step instead of one
    per cast). (`estimate --check` on traced tp 2 x dp 2 runs, delayed and tensorwise with both
    overlaps: every rank's bytes as predicted, checked by hand.)"""
    import json

    from cli_here import run_minitron
    model = ["--world", "2", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
             "--seq-length", "16", "--micro-batch-size", "1", "--vocab-size", "1023", "--bf16",
             "--use-distributed-optimizer", "--fp8-format", "hybrid", "--json"]
    plain, gathered = (json.loads(run_minitron("estimate", *model, *extra, here=True).stdout)["ranks"][0]
                       for extra in ([], ["--fp8-param-gather"]))
    assert plain["memory_bytes"]["params"] - gathered["memory_bytes"]["params"] == 2 * 12288
    assert plain["comm_bytes"]["dp-cp"] - gathered["comm_bytes"]["dp-cp"] == 12288
    assert plain["comm_bytes"]["tp-dp-cp"] == gathered["comm_bytes"]["tp-dp-cp"]
