"""`minitron estimate` against execution and against the closed forms.

One traced training iteration per layout, on forked gloo ranks running pretrain's own steps.
Each rank also measures what it really holds: the storages of its parameters, its DDP gradient
buffers, its optimizer state (fp32 main copies and moments), and the bytes autograd saves for
backward in every micro-batch (saved-tensor hooks). Then, on every rank:
* the bytes handed to each group kind inside train_step equal the estimate exactly;
* parameters, gradient and optimizer bytes equal the estimate exactly;
* the activations held at the schedule's peak (read from the trace's order of forward and
  backward steps) are within 10% of the estimate.
The layouts between them cover tp, pp, vp, dp, cp, sequence parallelism, the distributed
optimizer, fp16 / bf16, the modern options and recomputation.
"""

from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys

import pytest

from distributed import run_each
from minitron.cli.common import validate_pretrain
from minitron.cli.estimate import check_trace
from minitron.cli.views.diff import comm_by_key, recorded_args
from minitron.trace.reader import load_trace
from minitron.launcher import LaunchConfig, RankFailure, run_on_ranks, session_env
from minitron.training import theoretical_memory_usage as tmu
from minitron.training.tokenizer import build_tokenizer

# Two layers (four in the interleaved layout: pp 2 x vp 2 is a layer a virtual stage): the
# estimate counts each layer as the ranks run it, and more of them only cost the ranks CPU.
MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--vocab-size", "1023",
         "--distributed-backend", "gloo"]
FORWARD = "minitron.core.pipeline_parallel.schedules.forward_step"
BACKWARD = "minitron.core.pipeline_parallel.schedules.backward_step"


def _held(argv):
    """The body each rank runs: pretrain's steps for one iteration, measuring as it goes."""
    def body(rank):
        from minitron.pretrain_gpt import ARGS_DEFAULTS, forward_step, model_provider, train_valid_test_datasets_provider
        from minitron.training.data import build_train_valid_test_data_iterators
        from minitron.training.initialize import initialize_megatron
        from minitron.training.model_setup import setup_model_and_optimizer
        from minitron.training.training import train_step
        from minitron.training.global_vars import get_args
        from minitron.core.saved_tensors import SavedTensors

        initialize_megatron(args_defaults=ARGS_DEFAULTS, argv=argv)
        model, optimizer, scheduler = setup_model_and_optimizer(model_provider, "encoder_or_decoder")
        train_iter, _, _ = build_train_valid_test_data_iterators(train_valid_test_datasets_provider)
        params = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                  for chunk in model for p in chunk.parameters()}
        units = []   # saved bytes of each forward, in order

        weights = [p for chunk in model for p in chunk.parameters()]

        def measured(data_iterator, chunk):
            seen = SavedTensors(exclude=weights)
            with seen:
                output, loss_func = forward_step(data_iterator, chunk)
            units.append(seen)

            def loss(output_tensor):
                with seen:
                    return loss_func(output_tensor)
            return output, loss

        for chunk in model:
            chunk.train()
        get_args().curr_iteration = 0
        train_step(measured, train_iter, model, optimizer, scheduler)
        grads = sum(b.grad_data.untyped_storage().nbytes() for chunk in model
                    for b in chunk.buffers + getattr(chunk, "expert_parallel_buffers", []))
        inner = optimizer.optimizer
        state = sum(t.untyped_storage().nbytes() for s in inner.state.values() for k, t in s.items() if k != "step")
        main = sum(p.untyped_storage().nbytes() for g in inner.param_groups for p in g["params"]
                   if p.untyped_storage().data_ptr() not in params)
        return {"params": sum(params.values()), "grads": grads, "optimizer": state + main,
                "units": [u.nbytes for u in units]}
    return body


def run_layout(tmp_path, world, flags):
    argv = MODEL + flags
    trace_dir = tmp_path / "trace"
    cfg = LaunchConfig(world_size=world, log_dir=tmp_path / "logs", env=session_env(world, trace_dir))
    try:
        held = run_on_ranks(_held(argv), cfg)
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(30)}") from None
    return _estimated(argv, world, held, trace_dir)


def _estimated(argv, world, held, trace_dir):
    args = validate_pretrain(argv, world)
    build_tokenizer(args)
    return args, held, load_trace(trace_dir), trace_dir


def run_layouts(root, world, flagsets: dict) -> dict:
    """run_layout for several layouts of one world size on one set of ranks, each traced into
    its own directory (tests/distributed.py run_each)."""
    argvs = {name: MODEL + flags for name, flags in flagsets.items()}
    held = run_each(root, world, {name: _held(argv) for name, argv in argvs.items()})
    return {name: _estimated(argv, world, held[name], root / name / "trace") for name, argv in argvs.items()}


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
    "tp2-pp2": (4, ["--tp", "2", "--pp", "2", "--global-batch-size", "4"]),
    "tp2-modern-recompute": (2, ["--tp", "2", "--swiglu", "--normalization", "RMSNorm", "--group-query-attention",
                                 "--num-query-groups", "2", "--position-embedding-type", "rope",
                                 "--untie-embeddings-and-output-weights", "--recompute-granularity", "full",
                                 "--recompute-method", "block", "--recompute-num-layers", "1",
                                 "--disable-bias-linear", "--qk-layernorm", "--apply-layernorm-1p",
                                 "--norm-epsilon", "1e-6"]),
    "cp2-tp2-sp-bf16": (4, ["--cp", "2", "--tp", "2", "--sequence-parallel", "--group-query-attention",
                            "--num-query-groups", "2", "--bf16", "--accumulate-allreduce-grads-in-fp32",
                            "--hidden-dropout", "0"]),
    "pp2-vp2-dp2-distopt-fp16": (4, ["--num-layers", "4", "--pp", "2", "--vp", "2", "--use-distributed-optimizer",
                                     "--global-batch-size", "8", "--fp16", "--loss-scale", "1"]),
    "dp2-mla": (2, ["--multi-latent-attention", "--rope-type", "rope", "--q-lora-rank", "8", "--kv-lora-rank", "12",
                    "--qk-head-dim", "4", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "6", "--qk-layernorm",
                    "--normalization", "RMSNorm", "--global-batch-size", "2"]),
}
# Stress only (four ranks each, the default run's budget is spent): all-to-all context
# parallelism beside fewer key/value groups than tensor-parallel ranks, unfused and fused, and
# its hierarchical form.
STRESS = {
    "cp2-tp2-a2a-gqa1": (4, ["--cp", "2", "--tp", "2", "--cp-comm-type", "a2a", "--group-query-attention",
                             "--num-query-groups", "1", "--position-embedding-type", "rope"]),
    "cp4-a2a+p2p": (4, ["--cp", "4", "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2",
                        "2", "--seq-length", "32"]),
    "cp2-tp2-a2a-p2p-fused": (4, ["--num-layers", "4", "--cp", "2", "--tp", "2",   # a kind per layer: 4 layers
                                  "--cp-comm-type", "a2a", "p2p", "a2a", "p2p",
                                  "--attention-dropout", "0", "--group-query-attention", "--num-query-groups", "1"]),
}
LAYOUTS.update(STRESS)


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The default run's layouts, one launch per world size (run_layouts)."""
    from minitron.cli.command import expand_aliases
    root, out = tmp_path_factory.mktemp("layouts"), {}
    for world in sorted({w for name, (w, _) in LAYOUTS.items() if name not in STRESS}):
        out.update(run_layouts(root, world, {name: expand_aliases(flags) for name, (w, flags) in LAYOUTS.items()
                                             if w == world and name not in STRESS}))
    return out


@pytest.mark.parametrize("name", [name if name not in STRESS else pytest.param(name, marks=pytest.mark.stress)
                                  for name in LAYOUTS])
def test_estimate_matches_execution(tmp_path, capsys, request, name):
    world, flags = LAYOUTS[name]
    from minitron.cli.command import expand_aliases
    if name in STRESS:   # alone: the default run's fixture does not pay for them
        args, held, runs, trace_dir = run_layout(tmp_path, world, expand_aliases(flags))
    else:
        args, held, runs, trace_dir = request.getfixturevalue("executed")[name]
    costs = tmu.report_theoretical_memory(args)
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


# --- closed forms ---------------------------------------------------------------------------
def estimate_args(world, *flags):
    from minitron.cli.command import expand_aliases
    args = validate_pretrain(expand_aliases(list(flags)), world)
    build_tokenizer(args)
    return args


def gpt_params(L, h, V, s):
    """GPT-2 style, tied: 12Lh² (weights) + 13Lh (biases, norms) + (V + s)h + 2h (final norm);
    that is 12Lh²(1 + 13/(12h) + (V + s)/(12Lh)) + 2h."""
    return 12 * L * h * h + 13 * L * h + (V + s) * h + 2 * h


@pytest.mark.parametrize("layout", [(1, 1, 1), (8, 2, 2), (8, 1, 4), (16, 4, 2), (12, 3, 4)])
def test_parameters_add_up_to_the_closed_form(layout):
    world, tp, pp = layout
    L, h, heads, s = 8, 48, 12, 32
    args = estimate_args(world, "--tp", str(tp), "--pp", str(pp), "--num-layers", str(L), "--hidden-size", str(h),
                         "--num-attention-heads", str(heads), "--seq-length", str(s), "--micro-batch-size", "1",
                         "--vocab-size", "1000")
    V = args.padded_vocab_size
    assert tmu.total_params(args) == gpt_params(L, h, V, s)
    costs = tmu.report_theoretical_memory(args)
    # One data-parallel replica holds the model once, plus the last stage's copy of the tied
    # embedding when the first and last stage differ, plus tp - 1 more copies of what tensor
    # parallelism replicates: norms (4h a layer, 2h final), row-parallel biases (2h), positions.
    replica = sum(c.params for c in costs if _dp_rank(args, c.rank) == 0)
    replicated = L * 6 * h + 2 * h + s * h
    assert replica == gpt_params(L, h, V, s) + (V * h if pp > 1 else 0) + (tp - 1) * replicated
    untied = estimate_args(world, *[f for f in ("--tp", str(tp), "--pp", str(pp))], "--num-layers", str(L),
                           "--hidden-size", str(h), "--num-attention-heads", str(heads), "--seq-length", str(s),
                           "--micro-batch-size", "1", "--vocab-size", "1000", "--untie-embeddings-and-output-weights")
    assert tmu.total_params(untied) == gpt_params(L, h, V, s) + V * h


def _dp_rank(args, rank):
    from minitron.core.group_layout import rank_coordinates
    return rank_coordinates(rank, args.world_size, args.tensor_model_parallel_size,
                            args.pipeline_model_parallel_size, 1, args.order)["dp"]


GPT3 = ["--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96", "--seq-length", "2048",
        "--micro-batch-size", "1", "--global-batch-size", "1536", "--vocab-size", "50256", "--bf16",
        "--accumulate-allreduce-grads-in-fp32", "--attention-dropout", "0"]


def megatron_weight_and_optimizer(L, h, V, tp, pp, dp, dist_opt):
    """Megatron's compute_weight_and_optimizer_memory for a GPT without GQA, SwiGLU or MoE:
    12h² per layer split by tp, 4h of layernorm per layer and 2h of final norm replicated, one
    embedding on the most loaded stage; 18 bytes a parameter (bf16 weight, fp32 grad, fp32 main
    and two moments), 6 + 12/dp with the distributed optimizer. No biases, no position table."""
    sharded = (12 * h * h * L / pp + V * h) / tp
    replicated = (4 * h * L + 2 * h) / pp
    per_param = 6 + 12 / dp if dist_opt else 18
    return (sharded + replicated) * per_param, sharded + replicated


def megatron_activations_without_sp(L, h, s, b, tp, pp, m):
    """Megatron's compute_activation_memory_without_sp (first stage, 1F1B)."""
    per_layer = s * b * h * (10 + 24 / tp)
    total = per_layer * L + 8 * s * b * pp + s * b * h * pp
    if pp > 1:
        total *= min(1, m / pp)
    return total * 1.05


@pytest.mark.parametrize("tp,pp,dist_opt", [(8, 8, False), (8, 16, False), (8, 16, True)])
def test_gpt3_175b_against_megatrons_formula(tp, pp, dist_opt):
    world = 1024
    args = estimate_args(world, "--tp", str(tp), "--pp", str(pp), *GPT3,
                         *(["--use-distributed-optimizer"] if dist_opt else []))
    L, h, s, V, dp = 96, 12288, 2048, args.padded_vocab_size, world // (tp * pp)
    assert V == 51200
    costs = tmu.report_theoretical_memory(args)
    first = costs[0]   # stage 0: the embedding; Megatron's "most loaded shard"
    expected_bytes, expected_params = megatron_weight_and_optimizer(L, h, V, tp, pp, dp, dist_opt)
    # What Megatron leaves out: the biases (qkv 3h/tp, proj h, fc1 4h/tp, fc2 h per layer) and
    # the position table (s x h) on the first stage; it spreads the final norm over the stages.
    left_out = L / pp * (7 * h / tp + 2 * h) + s * h - 2 * h / pp
    assert first.params == pytest.approx(expected_params + left_out, abs=1e-6)
    held = first.memory["params"] + first.memory["grads"] + first.memory["optimizer"]
    if dist_opt:   # our buffer pads each parameter to 64 elements: a few KiB over
        assert held == pytest.approx(expected_bytes + left_out * (6 + 12 / dp), rel=1e-5)
    else:
        assert held == pytest.approx(expected_bytes + 18 * left_out, abs=1e-3)
    # Activations: Megatron's table without sequence parallelism (fused attention, no scores
    # kept). Ours counts 2sbh/t more per layer (the fused kernel's output beside the projection's
    # input) and the layernorms' statistics; Megatron adds 5% for temporaries.
    m = 1536 // dp
    expected = megatron_activations_without_sp(L, h, s, 1, tp, pp, m)
    assert first.memory["activations"] == pytest.approx(expected, rel=0.05)
    assert tmu.total_params(args) == gpt_params(L, h, V, s)   # 174.6 billion


# --- the command ----------------------------------------------------------------------------
def minitron(capsys, monkeypatch, *argv):
    """The command in this process (as `minitron ARGV`): its exit code, stdout and stderr."""
    from minitron.cli import main

    monkeypatch.setattr(sys, "argv", ["minitron", *argv])
    with pytest.raises(SystemExit) as stop:
        main()
    out = capsys.readouterr()
    return stop.value.code, out.out, out.err


def test_json_is_instant_and_torch_free():
    code = ("import sys, json, time; from minitron.cli import main; sys.argv = ['minitron', 'estimate', "
            "'--world', '1024', '--tp', '8', '--pp', '16', '--json', *" + repr(GPT3) + "];\n"
            "t = time.perf_counter()\ntry: main()\nexcept SystemExit: pass\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "False"   # torch never imported
    out = json.loads(done.stdout)
    assert set(out) == {"total_params", "flops_per_iteration", "tokens_per_iteration", "ranks"}
    assert len(out["ranks"]) == 1024
    rank = out["ranks"][1023]
    assert set(rank) == {"rank", "params", "memory_bytes", "comm_bytes"} and rank["rank"] == 1023
    assert set(rank["memory_bytes"]) == {"params", "grads", "optimizer", "activations"}
    assert {"tp", "pp", "dp-cp", "embd"} <= set(rank["comm_bytes"])


@pytest.mark.parametrize("argv,words", [
    (["--world", "8", "--tp", "3", *MODEL], "not divisible by tensor"),
    (["--tp", "2", *MODEL], "--world W is required"),
    (["--world", "0", *MODEL], "--world must be at least 1"),
    (["--world", "2", "--num-layer", "4"], "no such option --num-layer"),
    (["--check", "/nonexistent-dir"], "holds no rank*.jsonl"),
    (["--check", "/tmp", "--world", "2"], "drop the other flags"),
])
def test_bad_input_is_one_line(capsys, monkeypatch, argv, words):
    code, out, err = minitron(capsys, monkeypatch, "estimate", *argv)
    assert code == 2, out + err
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_chapter_figure_is_what_the_estimator_draws():
    """Chapter 17's plot is regenerated from the estimator and must match the committed file
    (rewrite it with `python docs/examples/layout_cost.py svg walkthrough/figures/17-memory-per-rank.svg`)."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("layout_cost", root / "docs/examples/layout_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (root / "walkthrough/figures/17-memory-per-rank.svg").read_text() == module.memory_svg()
