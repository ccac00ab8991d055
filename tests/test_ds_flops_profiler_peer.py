"""test_ds_flops_profiler.py's profiler held against the real DeepSpeed 0.19.8 on its CPU accelerator:

* DeepSpeed's FlopsProfiler and minitron's count the same FLOPs and MACs, module by module, on a
  GPT model of minitron's (linear layers, core attention, norms, activations) and on a model
  mixing the calls they count (torch.matmul, scaled_dot_product_attention, softmax, add, mul);
* the two engines, given the same ds_config with flops_profiler on, print the same profile from
  rank 0 at the same step, line for line once every latency and FLOPS rate (a measured time) is
  masked out.
"""
import contextlib
import io
import os
import re

import torch

from distributed import run_ranks
from deepspeed_child import NEEDS_DEEPSPEED
from test_ds_checkpoint import TiedNet, train
from test_ds_flops_profiler import profiled
from test_estimate_flops import BASE

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.norm, self.out = torch.nn.Linear(8, 24), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).view(2, 5, 3, 2, 4).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        scores = torch.nn.functional.softmax(torch.matmul(q, k.transpose(-1, -2)), -1)
        return self.out(torch.nn.functional.silu(a.reshape(2, 5, 8))) + torch.add(x, x).mul(2) + scores.sum()


def _counts(rank):
    from deepspeed.profiling.flops_profiler.profiler import FlopsProfiler, get_module_flops, get_module_macs
    from minitron.pretrain_gpt import ARGS_DEFAULTS, model_provider
    from minitron.training.global_vars import get_args
    from minitron.training.initialize import initialize_megatron
    initialize_megatron(args_defaults=ARGS_DEFAULTS, argv=BASE)
    args = get_args()
    tokens = torch.randint(0, 200, (args.micro_batch_size, args.seq_length))
    torch.manual_seed(0)
    cases = {"gpt": (model_provider(), (tokens, torch.arange(args.seq_length).expand_as(tokens), None)),
             "mixed": (Mixed(), (torch.randn(2, 5, 8),))}
    out = {}
    for name, (model, inputs) in cases.items():
        ds = FlopsProfiler(model)
        ds.start_profile()
        model(*inputs)
        ds.stop_profile()
        theirs = {n: (get_module_flops(m), get_module_macs(m)) for n, m in model.named_modules()}
        ds.end_profile()
        out[name] = {"deepspeed": theirs, "minitron": profiled(model, *inputs)}
    return out


def test_same_counts_module_by_module():
    counts = run_ranks(_counts, world_size=1)[0]
    for name in ("gpt", "mixed"):
        assert counts[name]["minitron"] == counts[name]["deepspeed"]
        assert counts[name]["minitron"][""][1] > 0


def _profiles(rank):
    import deepspeed   # only in the ranks: the tests' parent process stays free of it
    from minitron.runtime import initialize
    config = {"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "flops_profiler": {"enabled": True, "profile_step": 1, "module_depth": 2, "top_modules": 2}}
    out = {}
    for who, init in (("minitron", initialize), ("deepspeed", deepspeed.initialize)):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            engine, *_ = init(model=TiedNet(), config=config)
            train(engine, rank, "fp32", range(3))
        out[who] = printed.getvalue()
    return out


def profile_lines(text: str) -> list:
    """The profile's lines, each measured time and rate masked."""
    start = text.index("-------------------------- DeepSpeed Flops Profiler")
    body = text[start:text.index("------------------------------------------------------------------------------\n",
                                 start + 100)]
    body = re.sub(r"\nNote: .*?\n\n", "\n<note>\n", body, flags=re.S)   # each says in its own words how to read it
    masked = re.sub(r"[\d.]+ [munKMGT]?(s|FLOPS)\b", "<measured>", body)
    masked = re.sub(r"(samples/second: +)[\d.]+", r"\1<measured>", masked)
    return [re.sub(r"[\d.]+% latency", "<share>% latency", line).rstrip() for line in masked.splitlines()]


def test_engines_print_the_same_profile():
    printed = run_ranks(_profiles, world_size=2, tp=None)
    mine, ds = (profile_lines(printed[0][who]) for who in ("minitron", "deepspeed"))
    assert mine == ds
    assert "Flops Profiler" not in printed[1]["minitron"] + printed[1]["deepspeed"]
