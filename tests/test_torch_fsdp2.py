"""--use-torch-fsdp2: torch's own fully_shard trains the serial model's numbers, traced and estimated.

pretrain's path on 2 forked gloo ranks, three iterations of a 2-layer GPT with gradient clipping
(so the norm, summed over the DTensor rows and then over dp, matters), in one traced launch:

* the losses and gradient norms equal the serial run's to 1e-5 relative: FSDP2 averages each
  micro-batch's gradients in its reduce-scatter where the serial run sums them in one backward,
  so only the order of the sums differs (measured: 1e-7);
* the trace shows every unit all-gathered before its forward and again before its backward, and
  reduce-scattered after it, on the data-parallel group, with the shard's shape; and the bytes
  and calls each group kind was handed equal the estimate's;
* what a rank holds equals the estimate: its parameter shards plus the units whole at the peak
  (sampled at every gather and reduction), its gradients, and Adam's state. fc1 has 71 rows, so
  they split 36 + 35 and FSDP2 pads rank 1's chunk.

tp 2 x dp 2 (with sequence parallelism), bf16 and --torch-fsdp2-no-reshard-after-forward are
stress cases.
"""

from __future__ import annotations

import pytest

from distributed import pretrain_records
from minitron.cli.common import UserError, validate_pretrain
from minitron.cli.views.diff import comm_by_key
from minitron.launcher import LaunchConfig, RankFailure, run_on_ranks, session_env
from minitron.trace.reader import TRAIN_STEP, load_trace
from minitron.training import theoretical_memory_usage as tmu
from minitron.training.theoretical_torch_fsdp2 import unit_shards
from minitron.training.tokenizer import build_tokenizer

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--ffn-hidden-size", "71", "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "3",
         "--lr", "1e-2", "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo", "--clip-grad", "1.0", "--untie-embeddings-and-output-weights"]
FSDP2 = ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]
TOL = 1e-5
DIST = "torch.distributed."


def _curve(records):
    return [(r["lm_loss"], r["grad_norm"]) for r in records]


def _assert_close(curve, serial):
    assert len(curve) == len(serial) == 3
    for (loss, norm), (s_loss, s_norm) in zip(curve, serial):
        assert abs(loss - s_loss) <= TOL * abs(s_loss) and abs(norm - s_norm) <= TOL * s_norm, (curve, serial)
    assert serial[-1][0] < serial[0][0]   # the weights moved: the gathers carried new values


def _train_and_measure(argv):
    """Each rank: --train-iters train_steps, sampling what its parameters take at every gather
    and reduction (the shards, the units whole now, the gathers' outputs still alive); then
    {"curve": [(loss, grad norm)], "held": bytes of params at the peak, grads, optimizer}."""
    def body(rank):
        import weakref

        import torch

        from minitron.pretrain_gpt import ARGS_DEFAULTS, forward_step, model_provider, train_valid_test_datasets_provider
        from minitron.training.data import build_train_valid_test_data_iterators
        from minitron.training.global_vars import get_args
        from minitron.training.initialize import initialize_megatron
        from minitron.training.model_setup import setup_model_and_optimizer
        from minitron.training.training import train_step

        initialize_megatron(args_defaults=ARGS_DEFAULTS, argv=argv)
        args = get_args()
        args.iteration = args.consumed_train_samples = 0
        train_iter, _, _ = build_train_valid_test_data_iterators(train_valid_test_datasets_provider)
        model, optimizer, scheduler = setup_model_and_optimizer(model_provider, "encoder_or_decoder")
        fsdp = model[0]
        shards = fsdp.bytes_held()["params"]   # at rest: every unit sharded
        in_flight, peak = [], [shards]

        def sample():
            whole = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                     for p in fsdp.module.parameters() if not hasattr(p, "to_local")}
            gathering = sum(t.untyped_storage().nbytes() for t in (ref() for ref in in_flight) if t is not None)
            peak[0] = max(peak[0], shards + sum(whole.values()) + gathering)

        gather, scatter = torch.distributed.all_gather_single, torch.distributed.reduce_scatter_single

        def sampled_gather(output, *a, **kw):
            in_flight.append(weakref.ref(output))   # FSDP2 keeps it until the next all-gather
            sample()
            return gather(output, *a, **kw)

        def sampled_scatter(*a, **kw):
            sample()
            return scatter(*a, **kw)

        grads, step = [], optimizer.step

        def measured_step():   # the gradients as backward left them, before a 16-bit model's move to fp32
            grads.append(fsdp.bytes_held()["grads"])
            return step()

        torch.distributed.all_gather_single, torch.distributed.reduce_scatter_single = sampled_gather, sampled_scatter
        optimizer.step = measured_step
        curve = []
        try:
            for iteration in range(args.train_iters):
                args.curr_iteration = iteration
                loss, _, grad_norm, _ = train_step(forward_step, train_iter, model, optimizer, scheduler)
                curve.append((float(next(iter(loss.values()))), grad_norm))
        finally:
            torch.distributed.all_gather_single, torch.distributed.reduce_scatter_single = gather, scatter
        # Adam's moments, and the fp32 main copies of a 16-bit model (an fp32 one steps its own)
        state = [t.to_local() for s in optimizer.optimizer.state.values() for k, t in s.items() if k != "step"]
        state += [p.to_local() for g in getattr(optimizer, "fp32_from_float16_groups", []) for p in g]
        return {"curve": curve, "held": {"params": peak[0], "grads": grads[0],
                                         "optimizer": sum(t.numel() * t.element_size() for t in state)}}
    return body


def _launch(tmp_path, argv, trace_dir=None):
    import torch.distributed.fsdp  # noqa: F401  (loaded once here, 0.7 s of CPU, not once in each forked rank)
    cfg = LaunchConfig(world_size=2, log_dir=tmp_path / "logs", env=session_env(2, trace_dir))
    try:
        return run_on_ranks(_train_and_measure(argv), cfg)
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(30)}") from None


def _estimate(argv):
    args = validate_pretrain(argv, 2)
    build_tokenizer(args)
    return args, tmu.report_theoretical_memory(args)


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return _curve(pretrain_records(tmp_path_factory.mktemp("serial") / "run", 1, MODEL))


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """dp 2, traced: (what each rank returned, the traces of both ranks)."""
    out = tmp_path_factory.mktemp("fsdp2")
    return _launch(out, [*MODEL, *FSDP2], trace_dir=out / "trace"), load_trace(out / "trace")


def test_losses_equal_serial(sharded_run, serial):
    _assert_close(sharded_run[0][0]["curve"], serial)


@pytest.mark.stress
def test_tensor_parallel_with_fsdp2_equals_serial(tmp_path):
    model = [*MODEL, "--ffn-hidden-size", "72"]   # fc1's rows split over tp as well
    serial = _curve(pretrain_records(tmp_path / "serial", 1, model))
    argv = [*model, *FSDP2, "--tensor-model-parallel-size", "2", "--sequence-parallel"]
    _assert_close(_curve(pretrain_records(tmp_path / "run", 4, argv)), serial)


def test_trace_gathers_and_reduces_each_unit_on_the_dp_group(sharded_run):
    args, _ = _estimate([*MODEL, *FSDP2])
    shards = unit_shards(args)   # the embedding, the two layers, the root: this rank's padded shard
    records = sharded_run[1][0]
    step = [r for r in records if r["name"] == TRAIN_STEP][1]
    inside = [r for r in records if step["start_us"] <= r["start_us"] <= step["end_us"]]
    gathers = [r for r in inside if r["name"] == DIST + "all_gather_single"]
    scatters = [r for r in inside if r["name"] == DIST + "reduce_scatter_single"]
    for r in gathers + scatters:
        assert r["args"]["group"] == "DATA_PARALLEL_GROUP_WITH_CP" and r["args"]["ranks"] == [0, 1]
    # Per micro-batch (2 per rank): the root, the embedding, layer 0, layer 1 in forward; then
    # each again in backward: 8 gathers of a shard each, and 4 reduce-scatters of a whole unit.
    forward = [shards["(root)"], shards["embedding"], shards["decoder.layers.0"], shards["decoder.layers.1"]]
    assert [r["args"]["shape"] for r in gathers[:4]] == [[n] for n in forward]
    assert sorted(r["args"]["shape"][0] for r in gathers) == sorted(forward * 4)
    assert sorted(r["args"]["shape"][0] for r in scatters) == sorted([n * 2 for n in forward] * 2)


def test_traced_bytes_equal_the_estimate(sharded_run):
    args, costs = _estimate([*MODEL, *FSDP2])
    for cost in costs:
        for step in [r for r in sharded_run[1][cost.rank] if r["name"] == TRAIN_STEP]:
            window = [r for r in sharded_run[1][cost.rank] if step["start_us"] <= r["start_us"] <= step["end_us"]]
            tally = comm_by_key(window, args.params_dtype)
            assert {key: v[0] for key, v in tally.items()} == cost.comm, f"rank {cost.rank}: bytes"
            assert {key: v[1] for key, v in tally.items()} == cost.calls, f"rank {cost.rank}: calls"


def _assert_held_as_estimated(held, costs):
    for cost in costs:
        for key in ("params", "grads", "optimizer"):
            assert held[cost.rank]["held"][key] == cost.memory[key], \
                f"rank {cost.rank} {key}: {held[cost.rank]['held'][key]} held, {cost.memory[key]} estimated"
    # fc1's 71 rows (and its bias's 71 entries) split 36 + 35: rank 1 owns fewer, its chunk padded.
    assert held[1]["held"]["optimizer"] < held[0]["held"]["optimizer"]


def test_held_bytes_equal_the_estimate(sharded_run):
    _assert_held_as_estimated(sharded_run[0], _estimate([*MODEL, *FSDP2])[1])


@pytest.mark.stress
@pytest.mark.parametrize("variant", [["--bf16"], ["--torch-fsdp2-no-reshard-after-forward"]],
                         ids=["bf16", "no-reshard"])
def test_held_bytes_equal_the_estimate_in_variants(tmp_path, variant):
    argv = [*MODEL, *FSDP2, "--train-iters", "1", *variant]
    _assert_held_as_estimated(_launch(tmp_path, argv), _estimate(argv)[1])


@pytest.mark.parametrize("extra, words", [
    (["--pipeline-model-parallel-size", "2"], "not supported with pipeline parallelism"),
    (["--use-distributed-optimizer"], "drop --use-distributed-optimizer"),
    (["--fp16"], "not supported with --fp16"),
    (["--ckpt-format", "torch"], "requires --ckpt-format torch_dist"),
    (["--use-megatron-fsdp"], "two ways to shard"),
    (["--check-weight-hash-across-dp-replicas-interval", "1"], "each rank holds its rows"),
])
def test_what_megatron_refuses_is_refused_in_one_line(extra, words):
    with pytest.raises(UserError, match=words) as refused:
        validate_pretrain([*MODEL, *FSDP2, *extra], 2)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("drop, words", [
    ("--no-gradient-accumulation-fusion", "needs --no-gradient-accumulation-fusion"),
    ("--untie-embeddings-and-output-weights", "requires --untie-embeddings-and-output-weights"),
])
def test_what_megatron_requires_is_asked_for_in_one_line(drop, words):
    with pytest.raises(UserError, match=words) as refused:
        validate_pretrain([a for a in [*MODEL, *FSDP2] if a != drop], 2)
    assert "\n" not in str(refused.value)


def test_overlap_grad_reduce_is_listed_as_changing_nothing():
    from minitron.training.arguments_policy import no_effect_lines

    args = validate_pretrain([*MODEL, *FSDP2, "--overlap-grad-reduce"], 2)
    assert [line for line in no_effect_lines(args) if "--overlap-grad-reduce (with --use-torch-fsdp2)" in line]
