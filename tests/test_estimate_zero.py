"""`minitron estimate --deepspeed` against execution: ZeRO stages 0 to 3, rank by rank.

One launch of forked gloo ranks per layout runs pretrain's DeepSpeed path once per ZeRO stage
(stages 0-3 at dp 2 in fp32; 2 and 3 at tp 2 x dp 2 in bf16 with recomputation): a fresh model
and engine each, one traced train_step each, from one data iterator. Each rank measures what
it really holds: the storages behind its parameters (stage 3: its pieces), its gradients once
the last backward is done (before engine.step), its optimizer state after the step (fp32
master and moments), and the bytes autograd saves in every micro-batch. Then on every rank:
* the bytes handed to each group kind inside that train_step, and the number of calls, equal
  the estimate exactly;
* parameter, gradient and optimizer bytes equal the estimate exactly (and engine.bytes_held());
* the saved activations are within 10% of the estimate.
"""

from __future__ import annotations

import json

import pytest

from minitron.cli.command import expand_aliases
from minitron.cli.common import validate_pretrain
from minitron.cli.views.diff import comm_by_key
from minitron.trace.reader import TRAIN_STEP, load_trace
from minitron.launcher import LaunchConfig, RankFailure, run_on_ranks, session_env
from minitron.training import theoretical_memory_usage as tmu
from minitron.training.theoretical_zero import param_groups
from minitron.training.theoretical_params import model_params
from minitron.training.tokenizer import build_tokenizer

MODEL = ["--num-layers", "3", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "1", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023", "--distributed-backend", "gloo", "--deepspeed"]


def _configs(tmp_path, bf16: bool, stages) -> list[str]:
    """One ds_config per stage; a small reduce bucket so that stage 2 reduces in several."""
    paths = []
    for stage in stages:
        config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
                  "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000}}
        if bf16:
            config["bf16"] = {"enabled": True}
        path = tmp_path / f"ds{stage}.json"
        path.write_text(json.dumps(config))
        paths.append(str(path))
    return paths


def _held(argv, configs):
    """Each rank: initialize once, then per stage a fresh engine and one train_step."""
    def body(rank):
        from minitron.core.saved_tensors import SavedTensors
        from minitron.pretrain_gpt import ARGS_DEFAULTS, forward_step, model_provider, train_valid_test_datasets_provider
        from minitron.training.data import build_train_valid_test_data_iterators
        from minitron.training.deepspeed_training import setup_model_and_optimizer
        from minitron.training.global_vars import get_args
        from minitron.training.initialize import initialize_megatron
        from minitron.training.training import train_step

        # --train-iters as many as stages: one data iterator serves them all, a step each.
        initialize_megatron(args_defaults=ARGS_DEFAULTS, argv=argv + ["--deepspeed-config", configs[0],
                                                                      "--train-iters", str(len(configs))])
        get_args().iteration = get_args().consumed_train_samples = 0   # as setup_model_and_optimizer sets
        train_iter, _, _ = build_train_valid_test_data_iterators(train_valid_test_datasets_provider)
        out = []
        for config in configs:
            get_args().deepspeed_config = config
            model, optimizer, scheduler = setup_model_and_optimizer(model_provider, "encoder_or_decoder")
            engine, params = model[0], list(model[0].module.parameters())
            units, seen_at_step = [], {}

            def live(ts):
                return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in ts if t is not None}

            def measured(data_iterator, chunk):
                seen = SavedTensors(exclude=params)   # weights, gathered or not, are no activations
                with seen:
                    output, loss_func = forward_step(data_iterator, chunk)
                units.append(seen)

                def loss(output_tensor):
                    with seen:
                        return loss_func(output_tensor)
                return output, loss

            step = engine.step

            def measuring_step(*a, **k):   # the gradients held once the last backward is done
                zero = engine.optimizer
                grads = live(p.grad for p in params)
                if zero.partition_gradients:
                    grads = live(zero.averaged_gradients.values())
                seen_at_step.update(grads=sum(grads.values()), held=engine.bytes_held()["grads"])
                return step(*a, **k)
            engine.step = measuring_step
            get_args().curr_iteration = 0
            engine.train()
            train_step(measured, train_iter, model, optimizer, scheduler)
            zero = engine.optimizer
            storages = live([p.data for p in params] + [getattr(p, "ds_tensor", None) for p in params])
            masters = zero.single_partition_of_fp32_groups
            state = live(list(masters) + [t for m in masters for k, t in zero.optimizer.state.get(m, {}).items()
                                          if k != "step"])
            out.append({"params": sum(storages.values()), "grads": seen_at_step["grads"],
                        "optimizer": sum(state.values()), "bytes_held": engine.bytes_held(),
                        "grads_held": seen_at_step["held"], "units": [u.nbytes for u in units]})
        return out
    return body


LAYOUTS = {
    # Odd sizes (fc1 of 71 or 35 rows, three layers) so that the flat groups and the stage-3
    # pieces are padded.
    "dp2-fp32": (2, ["--ffn-hidden-size", "71"], False, (0, 1, 2, 3)),
    # Full recomputation of two layers of three: at stage 3 their modules gather a third time.
    # (Stage 1 sends over tp what stage 2 does; the first layout has it.)
    "tp2-dp2-bf16-recompute": (4, ["--tp", "2", "--ffn-hidden-size", "70", "--bf16", "--recompute-granularity",
                                   "full", "--recompute-method", "block", "--recompute-num-layers", "2"],
                               True, (2, 3)),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_zero_stages_match_execution(tmp_path, name):
    world, flags, bf16, stages = LAYOUTS[name]
    configs = _configs(tmp_path, bf16, stages)
    argv = expand_aliases(MODEL + flags)
    trace_dir = tmp_path / "trace"
    cfg = LaunchConfig(world_size=world, log_dir=tmp_path / "logs", env=session_env(world, trace_dir))
    try:
        held = run_on_ranks(_held(argv, configs), cfg)
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(30)}") from None
    runs = load_trace(trace_dir)
    for k, (stage, config) in enumerate(zip(stages, configs)):
        args = validate_pretrain(argv + ["--deepspeed-config", config], world)
        build_tokenizer(args)
        for cost in tmu.report_theoretical_memory(args):
            where = f"{name} stage {stage} rank {cost.rank}"
            measured = held[cost.rank][k]
            records = runs[cost.rank]
            step = [r for r in records if r["name"] == TRAIN_STEP][k]   # this stage's train_step
            window = [r for r in records if step["start_us"] <= r["start_us"] <= step["end_us"]]
            tally = comm_by_key(window, args.params_dtype)
            traced = {key: v[0] for key, v in tally.items()}
            assert traced == cost.comm, f"{where}: traced {traced}, estimated {cost.comm}"
            calls = {key: v[1] for key, v in tally.items()}   # ZeRO-2's buckets, ZeRO-3's modules
            assert calls == cost.calls, f"{where}: {calls} calls traced, {cost.calls} estimated"
            for key in ("params", "grads", "optimizer"):
                assert measured[key] == cost.memory[key], f"{where} {key}: {measured[key]} held, {cost.memory[key]} estimated"
            assert measured["bytes_held"]["params"] == cost.memory["params"]
            assert measured["grads_held"] == cost.memory["grads"]
            assert measured["bytes_held"]["optimizer_states"] == cost.memory["optimizer"]
            peak = max(measured["units"])   # one micro-batch in flight: forward, then its backward
            assert abs(cost.memory["activations"] - peak) <= 0.10 * peak, \
                f"{where}: activations {cost.memory['activations']} estimated, {peak} saved"


def test_param_groups_are_the_optimizers():
    """Weight decay on the matrices, none on biases and norms (_get_param_groups' rule)."""
    args = validate_pretrain(expand_aliases(MODEL[:-1]), 1)
    build_tokenizer(args)
    plain, one_d = param_groups(model_params(args, 0, 0))
    assert {p.name.rsplit(".", 1)[-1] for p in plain} == {"weight"}
    assert all(p.name.endswith(".bias") or "layernorm" in p.name for p in one_d)


def test_offload_refusal_is_one_line(capsys, monkeypatch, tmp_path):
    """What the engine does not offload is not estimated either: the ds_config's own refusal
    (part of the states offloaded, ratio < 1; zero/offload_config.py)."""
    import sys

    from minitron.cli import main

    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1, "zero_optimization":
                                  {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}))
    monkeypatch.setattr(sys, "argv", ["minitron", "estimate", "--world", "2", *MODEL, "--deepspeed-config", str(config)])
    with pytest.raises(SystemExit) as stop:
        main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "offload_optimizer.ratio 0.5" in err and len(err.strip().splitlines()) == 1, err


def test_deepspeeds_formulas_term_by_term():
    """DeepSpeed's estimate_zero2/3_model_states_mem_needs (no offload) for a 175B rank (tp 8 x
    dp 128, bf16), against ours term by term: 2-byte weights (ZeRO-2: all, ZeRO-3: P/N), a
    2-byte gradient partition, 4 + 8 bytes of master and moments per partition element, equal
    up to the padding. What DeepSpeed adds: an fp32 gradient partition (4P/N; ours exists only
    inside step()), and at ZeRO-3 the largest layer gathered with its gradient (4 bytes each)
    in place of the 2-byte gradient partition."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs/examples/zero_cost.py"
    spec = importlib.util.spec_from_file_location("zero_cost", path)
    zero_cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zero_cost)
    for stage in (2, 3):
        args, rank = zero_cost.costs(stage)
        P, N = rank.params, args.data_parallel_size
        largest = zero_cost.largest_module(model_params(args, 0, 0))
        held = rank.memory
        assert held["params"] == pytest.approx(2 * P if stage == 2 else 2 * P / N, rel=1e-6)
        assert held["grads"] == pytest.approx(2 * P / N, rel=1e-6)
        assert held["optimizer"] == pytest.approx(12 * P / N, rel=1e-6)
        ours = held["params"] + held["grads"] + held["optimizer"]
        theirs = zero_cost.deepspeed(stage, P, largest, N)
        extra = 4 * P / N if stage == 2 else 4 * largest + 2 * P / N
        assert theirs - ours == pytest.approx(extra, rel=1e-5)
    assert largest == args.padded_vocab_size // 8 * args.hidden_size   # the word embedding's shard
