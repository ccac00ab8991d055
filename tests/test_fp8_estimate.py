"""The accountant's fp8 terms against what autograd really keeps, and what a traced run sends.

For each layout, two models built from the same validated flags, one with --fp8-format and one
without, run one forward (the loss included) under saved-tensor hooks; the difference of the
bytes kept must be theoretical_fp8's delta exactly. tp 2 with sequence parallelism and SwiGLU,
and multi-latent attention (its two down projections share an input), both in bf16; the first
under mxfp8 too; and an MoE model at ep 2 (gated experts with a shared one, padded to capacity so
that every expert's rows are known: 72 arrive, fp8 pads them to 80), under both recipes. Then a
traced iteration of pretrain (tp 2, sequence parallelism, delayed scaling, two micro-batches) must send
exactly the bytes `minitron estimate` predicts to every group: the fp8 all-gathers and the
amax all-reduces included.
"""

from __future__ import annotations

import pytest
import torch

from distributed import run_ranks
from minitron.cli.estimate import check_trace
from minitron.cli.common import validate_pretrain
from minitron.training.theoretical_fp8 import fp8_activation_delta, fp8_state_bytes
from minitron.training.tokenizer import build_tokenizer

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "4", "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--vocab-size", "255",
         "--bf16", "--fp8-format", "hybrid", "--fp8-amax-history-len", "16"]
LAYOUTS = {
    "tp2-sp-swiglu": (2, ["--tp", "2", "--sequence-parallel", "--swiglu"]),
    "mla": (1, ["--multi-latent-attention", "--rope-type", "rope", "--q-lora-rank", "8", "--kv-lora-rank", "12",
                "--qk-head-dim", "4", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "6", "--qk-layernorm",
                "--normalization", "RMSNorm"]),
    "moe-ep2": (2, ["--ep", "2", "--num-experts", "4", "--moe-router-topk", "2", "--moe-expert-capacity-factor", "1.1",
                    "--moe-pad-expert-input-to-capacity", "--moe-token-dispatcher-type", "alltoall", "--swiglu",
                    "--disable-bias-linear", "--moe-shared-expert-intermediate-size", "64"]),
}


def _args(world, flags):
    from minitron.cli.command import expand_aliases
    args = validate_pretrain(expand_aliases(MODEL + flags), world)
    build_tokenizer(args)
    return args


def _measured_delta(args, recipes=("delayed",)):
    """Per recipe, the bytes a forward keeps with fp8 minus those it keeps without, on each rank."""
    def body(rank):
        import dataclasses
        from minitron.core.models.gpt import GPTModel
        from minitron.core.saved_tensors import SavedTensors
        from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
        from minitron.training.arguments import core_transformer_config_from_args

        kept = []
        for fp8, recipe in [("hybrid", r) for r in recipes] + [(None, "delayed")]:
            config = dataclasses.replace(core_transformer_config_from_args(args), fp8=fp8, fp8_recipe=recipe)
            model_parallel_cuda_manual_seed(5)
            model = GPTModel(config, args.padded_vocab_size, args.seq_length,
                             position_embedding_type=args.position_embedding_type)
            ids = torch.randint(0, 255, (args.micro_batch_size, args.seq_length), generator=torch.Generator())
            with SavedTensors(exclude=list(model.parameters())) as seen:
                model(ids, torch.arange(args.seq_length).expand_as(ids), labels=ids).sum()
            kept.append(seen.nbytes)
        return [k - kept[-1] for k in kept[:-1]]
    return run_ranks(body, world_size=args.world_size, tp=args.tensor_model_parallel_size,
                     ep=args.expert_model_parallel_size)


@pytest.mark.parametrize("name", LAYOUTS)
def test_fp8_bytes_are_what_autograd_keeps(name):
    world, flags = LAYOUTS[name]
    args = _args(world, flags)
    recipes = ("delayed",) if name == "mla" else ("delayed", "mxfp8")   # MLA's test sizes: not 32s
    estimated = []
    for recipe in recipes:
        args.fp8_recipe = recipe
        estimated.append(fp8_activation_delta(args, 0, 0))
    assert _measured_delta(args, recipes) == [estimated] * world


def test_fp8_state_bytes():
    args = _args(2, LAYOUTS["tp2-sp-swiglu"][1])
    assert fp8_state_bytes(args, 0) == 2 * 4 * 3 * 4 * (16 + 1)   # layers x linears x slots x fp32 (history, scale)
    args.fp8_recipe = "tensorwise"
    assert fp8_state_bytes(args, 0) == 2 * 4 * 3 * 4
    moe = _args(2, LAYOUTS["moe-ep2"][1])   # per layer: qkv, proj, the shared fc1 and fc2, 2 local experts' two
    assert fp8_state_bytes(moe, 0) == 2 * (4 + 2 * 2) * 3 * 4 * (16 + 1)


def test_traced_fp8_run_sends_what_estimate_predicts(tmp_path, capsys):
    """test_estimate's measured iteration, with fp8: the bytes sent to every group exactly, and
    the activations held at the peak within test_estimate's 10%."""
    from minitron.cli.command import expand_aliases
    from minitron.training import theoretical_memory_usage as tmu
    from test_estimate import peak_activations, run_layout

    flags = ["--tp", "2", "--sequence-parallel", "--global-batch-size", "2", "--bf16", "--fp8-format", "hybrid"]
    args, held, runs, trace_dir = run_layout(tmp_path, 2, expand_aliases(flags))
    check_trace(trace_dir, as_json=False)   # raises typer.Exit(1) on any difference
    assert "all 2 ranks sent exactly the predicted bytes" in capsys.readouterr().out
    for cost, measured in zip(tmu.report_theoretical_memory(args), held):
        peak = peak_activations(runs[cost.rank], measured["units"])
        assert abs(cost.memory["activations"] - peak) <= 0.10 * peak, (cost.memory["activations"], peak)
