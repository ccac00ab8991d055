"""The flops profiler (runtime/profiling/): the ds_config's ``flops_profiler`` section, DeepSpeed's
per-call formulas, the engine printing one step's profile from rank 0, and the count agreeing
with the project's own (training/theoretical_flops.py): a GPT forward's MACs, x2 (a multiply-add
is two FLOPs) x3 (backward costs twice the forward), are Megatron's count plus the causal half
of the attention scores, which Megatron leaves out. test_ds_flops_profiler_peer.py holds the
counts and the printed profile against DeepSpeed's own profiler and engine.
"""

import contextlib
import io

import pytest
import torch

from distributed import run_ranks
from minitron.runtime.config import DeepSpeedConfig
from minitron.runtime.config_values import DeepSpeedConfigError
from minitron.runtime.profiling.flops_profiler import FlopsProfiler
from minitron.runtime.profiling.report import module_flops, module_macs
from minitron.training.theoretical_flops import FMA, FWD_BWD, num_floating_point_operations
from test_ds_checkpoint import TiedNet, train
from test_estimate_flops import BASE, _args


def test_section_defaults_and_refusals():
    cfg = DeepSpeedConfig({"train_batch_size": 2, "flops_profiler": {"enabled": True}}, world_size=1)
    assert cfg.flops_profiler_config == {"enabled": True, "recompute_fwd_factor": 0.0, "profile_step": 1,
                                         "module_depth": -1, "top_modules": 1, "detailed": True, "output_file": None}
    assert cfg.wall_clock_breakdown   # the profiler turns the engine's timers on, as in DeepSpeed
    for section, words in (({"profile_step": -1}, "profile_step must be at least 0"),
                           ({"enabled": 1}, "enabled must be true or false"),
                           ({"output_file": 3}, "output_file must be a path"), ({"depth": 1}, "unknown key")):
        with pytest.raises(DeepSpeedConfigError, match=words):
            DeepSpeedConfig({"train_batch_size": 2, "flops_profiler": section}, world_size=1)


def profiled(model, *inputs):
    profiler = FlopsProfiler(model)
    profiler.start_profile()
    model(*inputs)
    profiler.stop_profile()
    counts = {name: (module_flops(m), module_macs(m)) for name, m in model.named_modules()}
    profiler.end_profile()
    return counts


def test_deepspeeds_formulas_per_module():
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.GELU(), torch.nn.LayerNorm(10), torch.nn.Linear(10, 3))
    counts = profiled(model, torch.randn(4, 6))
    # linear: 2 x (input elements x out features), bias not counted; gelu 1 and affine layer_norm 5 per element
    assert counts == {"": (960, 360), "0": (480, 240), "1": (40, 0), "2": (200, 0), "3": (240, 120)}
    assert torch.nn.functional.linear.__name__ == "linear" and not hasattr(model[0], "__flops__")   # all put back


def test_gpt_forward_agrees_with_megatrons_count():
    def body(rank):
        from minitron.pretrain_gpt import ARGS_DEFAULTS, model_provider
        from minitron.training.global_vars import get_args
        from minitron.training.initialize import initialize_megatron
        initialize_megatron(args_defaults=ARGS_DEFAULTS, argv=BASE)
        args = get_args()
        tokens = torch.randint(0, 200, (args.micro_batch_size, args.seq_length))
        counts = profiled(model_provider(), tokens, torch.arange(args.seq_length).expand_as(tokens), None)
        return counts[""][1]
    macs = run_ranks(body, world_size=1)[0]
    args = _args([])
    b, s, L = args.global_batch_size, args.seq_length, args.num_layers
    query = args.kv_channels * args.num_attention_heads
    causal_half = FWD_BWD * FMA * b * s * s * query * L
    assert FWD_BWD * FMA * macs == num_floating_point_operations(args, b) + causal_half


def _engine_profile(rank):
    from minitron.runtime import initialize
    printed = io.StringIO()
    config = {"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "flops_profiler": {"enabled": True, "profile_step": 1, "module_depth": 2, "top_modules": 2}}
    with contextlib.redirect_stdout(printed):
        engine, *_ = initialize(model=TiedNet(), config=config)
        train(engine, rank, "fp32", range(3))
    return printed.getvalue()


def test_engine_prints_one_profile_from_rank0():
    printed = run_ranks(_engine_profile, world_size=2, tp=None)
    assert "Flops Profiler" not in printed[1]
    text = printed[0]
    assert text.count("DeepSpeed Flops Profiler") == 1
    assert "Profile Summary at step 2:" in text   # profiled while global_steps was 1, labelled after the step
    assert "world size:                                                             2" in text
    # 2 rows a rank, each through enc (6 x 7), mid and dec (7 x 7 each) and head (7 x 3): 2 x 161 MACs
    assert "fwd MACs per GPU:                                                       322 MACs" in text
    for line in ("bwd FLOPS per GPU = 2 * fwd flops per GPU / bwd latency: ", "depth 1:", "(enc): Linear(49 = "):
        assert line in text
    assert "depth 2:" not in text   # module_depth 2 prints depths 0 and 1
