"""`minitron estimate` of a hybrid model against execution, as test_estimate holds a GPT's.

test_estimate's run (one traced iteration of pretrain's own steps on forked gloo ranks, each
rank measuring what it holds) with pretrain_hybrid's model in place of the GPT: the layouts'
parameters, gradient buffers and optimizer state must be the accountant's to the byte (the
Mamba layer's list in theoretical_mamba, the pattern's uneven '|' cut), the bytes handed to
each group kind exactly its count (one column/row pair per hybrid layer), and the activations
at the schedule's peak within 2% (test_estimate allows a GPT 10%; the Mamba layer's storages
are counted one by one in theoretical_mamba, the scan's as torch's einsum keeps them, so what
is left is the GPT halves' own small difference under sequence parallelism).
"""

from __future__ import annotations

import pytest

import minitron.pretrain_gpt
import minitron.pretrain_hybrid
import test_estimate
from minitron.cli.estimate import check_trace
from minitron.cli.views.diff import comm_by_key
from minitron.training import theoretical_memory_usage as tmu

HYBRID = ["--hybrid-layer-pattern", "M*-M|M-", "--mamba-head-dim", "8", "--mamba-num-groups", "2",
          "--mamba-state-dim", "8", "--normalization", "RMSNorm", "--disable-bias-linear",
          "--position-embedding-type", "none"]
LAYOUTS = {
    "tp2-sp-pp2, uneven": (4, ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                               "--pipeline-model-parallel-size", "2", "--global-batch-size", "4"]),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_hybrid_estimate_matches_execution(tmp_path, capsys, monkeypatch, name):
    world, flags = LAYOUTS[name]
    # the ranks are forked from here: they read pretrain_gpt's model_provider, now the hybrid one
    monkeypatch.setattr(minitron.pretrain_gpt, "model_provider", minitron.pretrain_hybrid.model_provider)
    args, held, runs, trace_dir = test_estimate.run_layout(tmp_path, world, HYBRID + flags)
    for cost, measured in zip(tmu.report_theoretical_memory(args), held):
        traced = {k: v[0] for k, v in comm_by_key(runs[cost.rank], args.params_dtype).items()}
        assert traced == cost.comm, f"{name} rank {cost.rank}: traced {traced}, estimated {cost.comm}"
        for key in ("params", "grads", "optimizer"):
            assert measured[key] == cost.memory[key], f"{name} rank {cost.rank} {key}: {measured[key]} held"
        peak = test_estimate.peak_activations(runs[cost.rank], measured["units"])
        assert abs(cost.memory["activations"] - peak) <= 0.02 * peak, \
            f"{name} rank {cost.rank}: activations {cost.memory['activations']} estimated, {peak} saved"
    check_trace(trace_dir, as_json=False)
    assert f"all {world} ranks sent exactly the predicted bytes" in capsys.readouterr().out


FLOP_MODEL = ["--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "2",
              "--global-batch-size", "2", "--vocab-size", "200", "--mamba-head-dim", "8", "--mamba-num-groups", "2",
              "--mamba-state-dim", "8", "--attention-dropout", "0.1",   # explicit matmuls, which the counter sees
              "--hybrid-layer-pattern", "M*-ME", "--num-experts", "4", "--moe-router-topk", "2",
              "--moe-ffn-hidden-size", "24", "--swiglu"]


def test_hybrid_flops_are_the_matmuls_less_megatrons_stated_omissions():
    """Megatron's hybrid_flops against torch's FLOP counter over one forward and backward.

    The counter finds, beyond Megatron's count: the attention's other causal half and the
    router's h x E GEMM (as test_estimate_flops finds for a GPT); the Mamba layer's depthwise
    conv (2 x C x (s + d_conv - 1) x d_conv per sequence forward, as much for the weight's
    gradient, and C times as much for the input's: torch's counter takes a grouped conv's
    input gradient for a dense one); and the scan's
    own matmuls (the chunked form's einsums, counted by running ssd_chunked alone on the same
    shapes) in place of Megatron's flat 7 x d_inner x state per token. in_proj, out_proj, the
    attention's and the MLPs' GEMMs and the logits are all in both, exactly."""
    from cli_here import run_minitron  # noqa: F401  (conftest's path: tests/ importable)
    from distributed import run_ranks
    from minitron.cli.command import expand_aliases
    from minitron.cli.common import validate_pretrain
    from minitron.training.theoretical_flops import FMA, FWD_BWD, num_floating_point_operations
    from minitron.training.theoretical_mamba import D_CONV, mamba_dims
    from minitron.training.tokenizer import build_tokenizer

    def body(rank):
        import torch
        from torch.utils.flop_counter import FlopCounterMode
        from minitron.core.ssm.ssd import ssd_chunked
        from minitron.pretrain_hybrid import ARGS_DEFAULTS, model_provider
        from minitron.training.global_vars import get_args
        from minitron.training.initialize import initialize_megatron

        torch.set_num_threads(1)
        initialize_megatron(args_defaults=ARGS_DEFAULTS, argv=expand_aliases(FLOP_MODEL))
        args = get_args()
        model = model_provider()
        tokens = torch.randint(0, 200, (args.micro_batch_size, args.seq_length))
        positions = torch.arange(args.seq_length).expand_as(tokens)
        whole, scan = FlopCounterMode(display=False), FlopCounterMode(display=False)
        with whole:
            model(tokens, positions, None, labels=tokens).float().mean().backward()
        mixer = model.decoder.layers[0].mixer
        b, s, heads, groups = args.micro_batch_size, args.seq_length, mixer.nheads, mixer.ngroups

        def leaf(*shape):
            return torch.rand(*shape, requires_grad=True)
        with scan:
            ssd_chunked(leaf(b, s, heads, mixer.headdim), leaf(b, s, heads), -leaf(heads), leaf(b, s, groups, 8),
                        leaf(b, s, groups, 8), mixer.chunk_size, D=leaf(heads)).sum().backward()
        return whole.get_total_flops(), scan.get_total_flops()

    counted, scan = run_ranks(body, world_size=1)[0]
    args = validate_pretrain(expand_aliases(FLOP_MODEL), 1)
    build_tokenizer(args)
    b, s, h = args.global_batch_size, args.seq_length, args.hidden_size
    m, mamba_layers = mamba_dims(args), args.hybrid_layer_pattern.count("M")
    causal_half = FWD_BWD * FMA * b * s * s * args.kv_channels * args.num_attention_heads   # one '*' layer
    router = FWD_BWD * FMA * b * s * h * args.num_experts                                    # one 'E' layer
    conv = (2 + m.conv) * FMA * b * m.conv * (s + D_CONV - 1) * D_CONV * mamba_layers
    megatron_scan = FWD_BWD * 7 * m.inner * args.mamba_state_dim * b * s * mamba_layers
    formula = num_floating_point_operations(args, b)
    expected = formula + causal_half + router + conv + scan * mamba_layers - megatron_scan
    assert counted == expected, f"counted {counted}, Megatron's {formula} and the stated differences {expected}"
