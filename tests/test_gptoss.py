"""Newer GPTs' layer variants at tp 2 give the serial loss, weights and gradients:

* gpt-oss's layer: learnable attention sinks (one logit per head, split over tp with the heads),
  the quick-GeGLU with its linear offset and clamp (clamped hard here, so the clamp acts), and
  Qwen 2.5's lone qkv bias (--disable-bias-linear --add-qkv-bias);
* Nemotron's squared-ReLU MLP with off-by-one sinks (a constant, no parameter);
* Llama 4's weightless query/key L2 norm, and a NoPE layer (--no-rope-freq).

One forked run per world size covers both, with sequence parallelism on at tp 2. The command
line's side (flags, one-line refusals, parameter count) is checked without torch ranks.
Megatron-Core's numbers for the same weights are test_mcore_gptoss's.
"""

from __future__ import annotations

import torch

from distributed import run_ranks
from minitron.core import parallel_state
from minitron.core.activations import quick_gelu, squared_relu
from minitron.core.models.gpt import GPTModel
from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
from minitron.core.transformer import TransformerConfig

VOCAB, SEQ, BATCH, TOL = 64, 8, 2, 1e-5
VARIANTS = {
    "gpt-oss": dict(softmax_type="learnable", gated_linear_unit=True, activation_func=quick_gelu,
                    glu_linear_offset=1.0, activation_func_clamp_value=0.5, add_bias_linear=False,
                    add_qkv_bias=True, num_query_groups=2),
    "nemotron": dict(softmax_type="off-by-one", activation_func=squared_relu),
    "llama-4 (qk l2 norm, layer 2 without rope)": dict(qk_l2_norm=True, no_rope_freq=2),
}


def tp_shard(full, param, rank: int, tp: int):
    """This rank's slice of the serial tensor, as tests/distributed.tp_shard cuts it, and
    round-robin for a strided one (a gated fc1: [gate_r | up_r])."""
    if not getattr(param, "tensor_model_parallel", False):
        return full
    pieces = full.chunk(tp * param.partition_stride, dim=param.partition_dim)
    return torch.cat(pieces[rank::tp], dim=param.partition_dim)


def _run(tp: int):
    def body(rank):
        from minitron.core.distributed.finalize_model_grads import _allreduce_layernorm_grads  # as test_mla
        torch.set_num_threads(1)
        out = {}
        for name, fields in VARIANTS.items():
            config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                                       hidden_dropout=0.0, attention_dropout=0.0, init_seed=3, init_method_std=0.3,
                                       tensor_model_parallel_size=tp, sequence_parallel=tp > 1, **fields)
            model_parallel_cuda_manual_seed(5)
            model = GPTModel(config, VOCAB, SEQ, position_embedding_type="rope")
            g = torch.Generator().manual_seed(1)
            ids, labels = (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(2))
            loss = model(ids, torch.arange(SEQ).expand(BATCH, SEQ), labels=labels)
            loss.mean().backward()
            _allreduce_layernorm_grads([model], config)
            params = dict(model.named_parameters())
            if tp == 1:
                out[name] = {"loss": loss.detach(), "weights": {n: p.detach() for n, p in params.items()},
                             "grads": {n: p.grad for n, p in params.items()}}
                continue
            r, serial = parallel_state.get_tensor_model_parallel_rank(), _run.serial[name]
            assert set(params) == set(serial["weights"]), name
            out[name] = {"loss": (loss.detach() - serial["loss"]).abs().max().item(),
                         "exact": all(torch.equal(p.detach(), tp_shard(serial["weights"][n], p, r, tp))
                                      for n, p in params.items()),
                         "grad": max(((p.grad - tp_shard(serial["grads"][n], p, r, tp)).abs().max().item(), n)
                                     for n, p in params.items())}
        return out
    return run_ranks(body, world_size=tp, tp=tp)


def test_gptoss_and_nemotron_layers_at_tp2_equal_serial():
    _run.serial = serial = _run(1)[0]
    oss = serial["gpt-oss"]["weights"]
    assert oss["decoder.layers.0.self_attention.core_attention.softmax_offset"].shape == (4,)
    assert "decoder.layers.0.self_attention.linear_qkv.bias" in oss
    assert "decoder.layers.0.self_attention.linear_proj.bias" not in oss
    assert "decoder.layers.0.self_attention.core_attention.softmax_offset" not in serial["nemotron"]["weights"]
    for r in _run(2):
        for name, got in r.items():
            assert got["exact"] and got["loss"] < TOL and got["grad"][0] < TOL, (name, got)


def test_layer_variant_flags():
    from minitron.training.arguments import core_transformer_config_from_args, parse_args, validate_args
    from minitron.training.argument_groups import ArgumentError
    from minitron.training.theoretical_params import layer_params

    base = ("--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16 "
            "--micro-batch-size 1 --vocab-size 64 --disable-bias-linear ").split()

    def args_of(flags, world=1):
        args = parse_args(argv=base + flags.split())
        args.world_size = world
        validate_args(args)
        return args
    oss = args_of("--quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 7 --softmax-type learnable "
                  "--add-qkv-bias")
    config = core_transformer_config_from_args(oss)
    assert (config.activation_func, config.gated_linear_unit, config.glu_linear_offset,
            config.activation_func_clamp_value, config.softmax_type, config.add_qkv_bias) == (
        quick_gelu, True, 1.0, 7.0, "learnable", True)
    # what the flags add to a layer: 2 sink logits, the qkv bias (3 x 16), fc1 twice as wide
    def count(args):
        return sum(p.numel for p in layer_params(args, 0))
    assert count(oss) - count(args_of("")) == 2 + 48 + 16 * 64
    assert core_transformer_config_from_args(args_of("--squared-relu")).activation_func is squared_relu
    for flags, words in (("--glu-linear-offset 1", "--glu-linear-offset"), ("--squared-relu --swiglu", "--swiglu"),
                         ("--no-rope-freq 3 --position-embedding-type rope", "--num-layers"),
                         ("--no-rope-freq [0,1]", "--position-embedding-type learned_absolute"),
                         ("--softmax-type learnable --context-parallel-size 2", "sink")):
        try:
            args_of(flags, world=2)
        except ArgumentError as exc:
            assert words in str(exc) and "\n" not in str(exc), exc
        else:
            raise AssertionError(f"{flags} was not refused")
