"""`minitron estimate` with experts, against execution.

* padded to capacity (--moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity), the
  bytes handed to every group kind (ep's all-to-alls, expert tp's gathers, expt-dp's reductions)
  equal the traced run's exactly, and --check says so; with the all-gather dispatcher (Megatron's
  default) too, whose messages over the expert tp x ep group always carry every token;
* with or without padding, the parameters, gradient buffers and optimizer state equal what the
  ranks hold (the experts' buffer over the expert-data-parallel group, sharded by the
  distributed optimizer), and activations are within 10% of the bytes saved for backward;
* dropless, --check shows the all-to-all's expectation beside the measurement and fails no rank.
"""

import json

import pytest
from test_estimate import MODEL, peak_activations, run_layouts

from minitron.cli.estimate import check_trace
from minitron.cli.views.diff import comm_by_key
from minitron.training import theoretical_memory_usage as tmu
from minitron.training.theoretical_moe import expectation_keys

MOE = ["--num-layers", "2", "--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "1e-2", "--moe-layer-freq", "2",
       "--hidden-dropout", "0", "--attention-dropout", "0"]
A2A = ["--moe-token-dispatcher-type", "alltoall"]   # else Megatron's default, the all-gather
PAD = ["--moe-expert-capacity-factor", "1.5", "--moe-pad-expert-input-to-capacity"]
LAYOUTS = {   # name: (world, flags, exact communication)
    # expert tp 2 allows no biases; a shared expert (split over tp like the dense MLP) instead;
    # gated (--swiglu): every fc1, routed and shared, [gate | up] cut with stride 2
    "ep2-tp2-sp-pad": (4, ["--tp", "2", "--sequence-parallel", "--ep", "2", "--disable-bias-linear", "--swiglu",
                           "--moe-shared-expert-intermediate-size", "32", *PAD, *A2A], True),
    # the all-gather dispatcher: every message carries all tokens, padded or not
    "dp4-ep2-distopt-pad-allgather": (4, ["--ep", "2", "--use-distributed-optimizer", "--global-batch-size", "4",
                                          *PAD], True),
    "ep2-dropless": (2, ["--ep", "2", "--global-batch-size", "4", *A2A], False),
}


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Each world size's layouts on one launch, each rank running them in turn (run_layouts)."""
    from minitron.cli.command import expand_aliases
    root, out = tmp_path_factory.mktemp("moe_layouts"), {}
    for world in sorted({w for w, _, _ in LAYOUTS.values()}):
        out.update(run_layouts(root, world, {name: expand_aliases(MOE + flags)
                                             for name, (w, flags, _) in LAYOUTS.items() if w == world}))
    return out


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_moe_estimate_matches_execution(executed, capsys, name):
    world, flags, exact = LAYOUTS[name]
    args, held, runs, trace_dir = executed[name]
    assert (not expectation_keys(args)) == exact
    for cost, measured in zip(tmu.report_theoretical_memory(args), held):
        traced = {k: v[0] for k, v in comm_by_key(runs[cost.rank], args.params_dtype).items()}
        if exact:
            assert traced == cost.comm, f"{name} rank {cost.rank}: traced {traced}, estimated {cost.comm}"
        else:   # every key but the all-to-all's, exactly; that one near its expectation
            assert {k: v for k, v in traced.items() if k != "ep"} == {k: v for k, v in cost.comm.items() if k != "ep"}
            assert cost.comm["ep"] * 0.5 <= traced["ep"] <= cost.comm["ep"] * 1.5
        for key in ("params", "grads", "optimizer"):
            assert measured[key] == cost.memory[key], f"{name} rank {cost.rank} {key}: {measured[key]} held"
        peak = peak_activations(runs[cost.rank], measured["units"])
        assert abs(cost.memory["activations"] - peak) <= 0.10 * peak, \
            f"{name} rank {cost.rank}: activations {cost.memory['activations']} estimated, {peak} saved"
    check_trace(trace_dir, as_json=True)   # raises typer.Exit(1) on any difference
    report = json.loads(capsys.readouterr().out)
    assert all(r["match"] for r in report["ranks"])
    assert report.get("expectation_keys", []) == ([] if exact else ["ep"])


def test_moe_params_against_closed_form():
    """E experts of 2 x h x ffn (and their biases) in every MoE layer, plus the router's E x h and
    E biases; ep divides the experts."""
    from test_estimate import estimate_args

    h, ffn, e, layers = 64, 256, 8, 4
    flags = ["--num-layers", str(layers), "--hidden-size", str(h), "--ffn-hidden-size", str(ffn),
             "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "1000", "--micro-batch-size", "1",
             "--num-experts", str(e)]
    dense = tmu.total_params(estimate_args(1, *flags[:-2]))
    moe = tmu.total_params(estimate_args(8, "--ep", "4", *flags))
    mlp = 2 * h * ffn + ffn + h   # the dense MLP's weights and biases
    # each expert an MLP with its biases (expert tp 1), the router's weight and bias
    assert moe - dense == layers * (e * mlp + e * h + e - mlp)
    per_rank = tmu.report_theoretical_memory(estimate_args(8, "--ep", "4", *flags))[0].params
    serial = tmu.report_theoretical_memory(estimate_args(1, *flags))[0].params
    assert serial - per_rank == layers * (e - e // 4) * mlp   # 3/4 of the experts elsewhere


def test_estimate_refuses_padding_without_capacity(capsys, monkeypatch):
    from test_estimate import minitron

    code, out, err = minitron(capsys, monkeypatch, "estimate", "--world", "2", "--ep", "2", "--num-experts", "4",
                              "--moe-pad-expert-input-to-capacity", *MODEL)
    assert code == 2 and "give --moe-expert-capacity-factor" in err and len(err.strip().splitlines()) == 1, err
