"""`minitron estimate` against execution and against the closed forms.

One traced training iteration per layout, on forked gloo ranks running pretrain's own steps.
Each rank also measures what it really holds: the storages of its parameters, its DDP gradient
buffers, its optimizer state (fp32 main copies and moments), and the bytes autograd saves for
backward in every micro-batch (saved-tensor hooks). Then, on every rank:
* the bytes handed to each group kind inside train_step equal the estimate exactly;
* parameters, gradient and optimizer bytes equal the estimate exactly;
* the activations held at the schedule's peak (read from the trace's order of forward and
  backward steps) are within 10% of the estimate.
"""

from __future__ import annotations

import pytest

from minitron.cli.common import validate_pretrain
from minitron.cli.estimate import check_trace
from minitron.cli.views.diff import comm_by_key, recorded_args
from minitron.cli.views.trace_dir import load_trace
from minitron.launcher import LaunchConfig, RankFailure, run_on_ranks, session_env
from minitron.training import theoretical_memory_usage as tmu
from minitron.training.tokenizer import build_tokenizer

MODEL = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--vocab-size", "1023",
         "--distributed-backend", "gloo"]
FORWARD = "minitron.core.pipeline_parallel.schedules.forward_step"
BACKWARD = "minitron.core.pipeline_parallel.schedules.backward_step"


def _held(argv):
    """The body each rank runs: pretrain's steps for one iteration, measuring as it goes."""
    def body(rank):
        import torch

        from minitron.pretrain_gpt import ARGS_DEFAULTS, forward_step, model_provider, train_valid_test_datasets_provider
        from minitron.training.data import build_train_valid_test_data_iterators
        from minitron.training.initialize import initialize_megatron
        from minitron.training.model_setup import setup_model_and_optimizer
        from minitron.training.training import train_step
        from minitron.training.global_vars import get_args

        initialize_megatron(args_defaults=ARGS_DEFAULTS, argv=argv)
        model, optimizer, scheduler = setup_model_and_optimizer(model_provider, "encoder_or_decoder")
        train_iter, _, _ = build_train_valid_test_data_iterators(train_valid_test_datasets_provider)
        params = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                  for chunk in model for p in chunk.parameters()}
        units = []   # saved bytes of each forward, in order

        def measured(data_iterator, chunk):
            seen = {}

            def pack(t):
                storage = t.untyped_storage()
                if storage.data_ptr() not in params:
                    seen[storage.data_ptr()] = storage.nbytes()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                output, loss_func = forward_step(data_iterator, chunk)
            units.append(seen)

            def loss(output_tensor):
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    return loss_func(output_tensor)
            return output, loss

        for chunk in model:
            chunk.train()
        get_args().curr_iteration = 0
        train_step(measured, train_iter, model, optimizer, scheduler)
        grads = sum(b.grad_data.untyped_storage().nbytes() for chunk in model for b in chunk.buffers)
        inner = optimizer.optimizer
        state = sum(t.untyped_storage().nbytes() for s in inner.state.values() for k, t in s.items() if k != "step")
        main = sum(p.untyped_storage().nbytes() for g in inner.param_groups for p in g["params"]
                   if p.untyped_storage().data_ptr() not in params)
        return {"params": sum(params.values()), "grads": grads, "optimizer": state + main,
                "units": [sum(u.values()) for u in units]}
    return body


def run_layout(tmp_path, world, flags):
    argv = MODEL + flags
    trace_dir = tmp_path / "trace"
    cfg = LaunchConfig(world_size=world, log_dir=tmp_path / "logs", env=session_env(world, trace_dir))
    try:
        held = run_on_ranks(_held(argv), cfg)
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(30)}") from None
    args = validate_pretrain(argv, world)
    build_tokenizer(args)
    return args, held, load_trace(trace_dir), trace_dir


def peak_activations(records, units) -> int:
    """The most saved bytes alive at once: forwards in, backwards out, in the trace's order."""
    events = sorted((r for r in records if r["name"] in (FORWARD, BACKWARD)), key=lambda r: r["start_us"])
    alive, peak, k = {}, 0, 0
    for r in events:
        key = (r["args"].get("chunk"), r["args"].get("microbatch"))
        if r["name"] == FORWARD:
            alive[key] = units[k]
            k += 1
            peak = max(peak, sum(alive.values()))
        else:
            alive.pop(key)
    return peak


LAYOUTS = {
    "tp2-pp2-dp2": (8, ["--tp", "2", "--pp", "2", "--global-batch-size", "8"]),
    "tp2-sp-bf16": (2, ["--tp", "2", "--sequence-parallel", "--bf16", "--accumulate-allreduce-grads-in-fp32",
                        "--hidden-dropout", "0", "--attention-dropout", "0"]),
    "pp2-vp2-distopt-dp2": (8, ["--pp", "2", "--vp", "2", "--use-distributed-optimizer", "--global-batch-size", "8",
                                "--tp", "2", "--fp16", "--loss-scale", "1"]),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_estimate_matches_execution(tmp_path, capsys, name):
    world, flags = LAYOUTS[name]
    from minitron.cli.command import expand_aliases
    args, held, runs, trace_dir = run_layout(tmp_path, world, expand_aliases(flags))
    costs = tmu.estimate(args)
    for cost, measured in zip(costs, held):
        traced = {k: v[0] for k, v in comm_by_key(runs[cost.rank], args.params_dtype).items()}
        assert traced == cost.comm, f"{name} rank {cost.rank}: traced {traced}, estimated {cost.comm}"
        for key in ("params", "grads", "optimizer"):
            assert measured[key] == cost.memory[key], f"{name} rank {cost.rank} {key}: {measured[key]} held"
        peak = peak_activations(runs[cost.rank], measured["units"])
        assert abs(cost.memory["activations"] - peak) <= 0.10 * peak, \
            f"{name} rank {cost.rank}: activations {cost.memory['activations']} estimated, {peak} saved"
    # The trace keeps the arguments, so --check needs nothing else, and agrees.
    assert recorded_args(runs)["tensor_model_parallel_size"] == args.tensor_model_parallel_size
    check_trace(trace_dir, as_json=False)   # raises typer.Exit(1) on any difference
    assert f"all {world} ranks sent exactly the predicted bytes" in capsys.readouterr().out
