"""ZeRO-Offload and ZeRO-Infinity (runtime/zero/offload.py, offload_config.py, swap_tensor/,
ops/adam/cpu_adam.py) on two gloo ranks, one traced run shared by every test:

* with the same optimizer (torch's AdamW, ``torch_adam``), offloading changes where tensors
  live and not one number: losses and final weights are bit-equal to plain ZeRO at stages 1-3,
  with offload_optimizer, offload_param, both, NVMe and the deprecated ``cpu_offload``;
* the config's "Adam" becomes CPU-Adam under offload_optimizer, whose float32 arithmetic is not
  FusedAdam's: equal within float32 rounding, not bit for bit;
* the bytes: device vs host per rank, the trace's crossings with their byte counts, and the
  swap files as DeepSpeed lays them out (names, 1 KiB-aligned sizes, the 1 MiB floor).
"""

import json
import os
from pathlib import Path

import pytest
import torch

from distributed import run_ranks

from minitron.runtime.config import DeepSpeedConfig
from minitron.runtime.config_values import DeepSpeedConfigError

IN, OUT, BATCH, STEPS = 8, 4, 4, 3
TORCH_ADAM = {"type": "Adam", "params": {"lr": 0.001, "weight_decay": 0.01, "torch_adam": True}}
FUSED_ADAM = {"type": "Adam", "params": {"lr": 0.001, "weight_decay": 0.01}}
CPU = {"device": "cpu"}
# name: (stage, optimizer, extra zero_optimization keys); "plainN" is what the others are held to
CASES = {
    "plain1": (1, TORCH_ADAM, {}), "cpu_offload1": (1, TORCH_ADAM, {"cpu_offload": True}),
    "plain2": (2, TORCH_ADAM, {}), "optimizer2": (2, TORCH_ADAM, {"offload_optimizer": CPU}),
    "nvme2": (2, TORCH_ADAM, {"offload_optimizer": {"device": "nvme", "nvme_path": "NVME"}}),
    "plain3": (3, TORCH_ADAM, {}), "optimizer3": (3, TORCH_ADAM, {"offload_optimizer": CPU}),
    "param3": (3, TORCH_ADAM, {"offload_param": CPU}),
    "both3": (3, TORCH_ADAM, {"offload_optimizer": CPU, "offload_param": CPU}),
    "nvme3": (3, TORCH_ADAM, {"offload_optimizer": {"device": "nvme", "nvme_path": "NVME"}, "offload_param": CPU}),
    "fused2": (2, FUSED_ADAM, {}), "cpu_adam2": (2, FUSED_ADAM, {"offload_optimizer": CPU}),
}


def _model() -> torch.nn.Module:
    """The matrices' group is 532,480 elements: at stage 3 each rank's fp32 master of it is
    1,064,960 bytes, over DeepSpeed's 1 MiB floor for swapping; the biases' and norm's group
    (2,564 elements) stays under it."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, 512), torch.nn.Tanh(), torch.nn.LayerNorm(512),
                               torch.nn.Linear(512, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, OUT))


def _groups(model) -> list:
    return [{"params": [p for p in model.parameters() if p.dim() == 2]},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


def _body(nvme_root: str):
    def body(rank):
        import time

        import torch.distributed as dist
        from minitron.runtime import initialize
        out = {}
        for name, (stage, optimizer, extra) in CASES.items():
            zero = json.loads(json.dumps({"stage": stage, **extra}).replace("NVME", f"{nvme_root}/{name}"))
            model = _model()
            engine, *_ = initialize(model=model, model_parameters=_groups(model), config={
                "train_batch_size": BATCH, "optimizer": optimizer, "zero_optimization": zero})
            start, losses = time.time() * 1e6, []
            for step in range(STEPS):
                g = torch.Generator().manual_seed(step)
                x, y = torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)
                rows = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
                loss = engine.backward(torch.nn.functional.mse_loss(engine(x[rows]), y[rows]))
                engine.step()
                t = loss.detach().clone()
                dist.all_reduce(t)
                losses.append(t.item())
            out[name] = {"losses": losses, "device": engine.bytes_held(), "host": engine.host_bytes_held(),
                         "window": (start, time.time() * 1e6), "optimizer": type(engine.basic_optimizer).__name__}
            if stage == 3:   # every weight gathered, as the model would see it
                engine.optimizer.gather([p for p in model.parameters()])
            out[name]["weights"] = [p.detach().clone() for p in model.parameters()]
        return out
    return body


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("offload")
    results = run_ranks(_body(str(root / "nvme")), world_size=2, tp=None, trace_dir=str(root / "trace"))
    records = [json.loads(line) for line in open(root / "trace" / "rank0.jsonl")]
    return results, records, root


def _crossings(records, window, kind: str) -> list:
    return [r["args"] for r in records if r["name"].endswith(kind) and window[0] <= r["start_us"] <= window[1]]


@pytest.mark.parametrize("name", ["cpu_offload1", "optimizer2", "nvme2", "optimizer3", "param3", "both3", "nvme3"])
def test_offloading_changes_no_number(runs, name):
    """Same optimizer, same arithmetic, same order: only where the tensors live differs."""
    results, _, _ = runs
    plain = f"plain{CASES[name][0]}"
    for rank in (0, 1):
        got, want = results[rank][name], results[rank][plain]
        assert got["losses"] == want["losses"], (name, rank)
        assert all(torch.equal(a, b) for a, b in zip(got["weights"], want["weights"])), (name, rank)


def test_cpu_adam_is_adam_to_float32_rounding(runs):
    """The config's Adam under offload_optimizer is CPU-Adam (float32 bias corrections and fmas),
    beside FusedAdam's torch arithmetic: the same update to within float32 rounding. Three steps
    of lr 0.001 leave the weights within a few ulps of each other; the loss of
    the next batch, summed over 535k weights' effects, within 1e-5 relative."""
    results, _, _ = runs
    fused, cpu = results[0]["fused2"], results[0]["cpu_adam2"]
    assert (fused["optimizer"], cpu["optimizer"]) == ("FusedAdam", "DeepSpeedCPUAdam")
    assert cpu["losses"] == pytest.approx(fused["losses"], rel=1e-5)
    assert cpu["losses"] != fused["losses"]   # not bit-equal: the arithmetic differs
    for a, b in zip(cpu["weights"], fused["weights"]):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-6)   # 1 ulp at 1.0 (the norm) is 1.2e-7


def test_bytes_move_from_device_to_host(runs):
    """Between steps, per rank: the optimizer side (fp32 master + two moments = 12 bytes an
    element of my partition) leaves the device for the host; offload_param moves the stage-3
    pieces too; NVMe leaves in host memory only the group under the 1 MiB floor."""
    results, _, _ = runs
    r = results[0]
    states = r["plain2"]["device"]["optimizer_states"]
    assert r["optimizer2"]["device"]["optimizer_states"] == 0 and r["optimizer2"]["host"]["optimizer_states"] == states
    pieces = r["plain3"]["device"]["params"]
    assert pieces > 0 and r["param3"]["device"]["params"] == 0 and r["param3"]["host"]["params"] == pieces
    assert r["param3"]["device"]["optimizer_states"] == r["plain3"]["device"]["optimizer_states"]
    assert r["both3"]["host"] == {"params": pieces, "optimizer_states": r["plain3"]["device"]["optimizer_states"]}
    small = (2564 // 2) * 12   # biases and norm: my half, master and moments, in host memory
    assert r["nvme3"]["host"]["optimizer_states"] == small


def test_trace_names_each_crossing_with_its_bytes(runs):
    results, records, _ = runs
    window = results[0]["optimizer2"]["window"]
    to_host = _crossings(records, window, "copy_gradients_to_host")
    to_device = _crossings(records, window, "copy_params_to_device")
    # stage 2, two groups, three steps: my fp32 gradient partition out, my updated weights back
    assert len(to_host) == len(to_device) == 2 * STEPS
    partition = results[0]["plain2"]["device"]["optimizer_states"] // 12   # elements of my partitions
    assert sum(a["bytes"] for a in to_host) == STEPS * partition * 4
    assert sum(a["bytes"] for a in to_device) == STEPS * partition * 4   # fp32 weights here
    # offload_param alone: the pieces come to the device before every gather, and the updated
    # master (left on the device) goes back to the host pieces after each step
    window = results[0]["param3"]["window"]
    assert _crossings(records, window, "copy_params_to_device") and not _crossings(records, window,
                                                                                    "copy_gradients_to_host")
    back = _crossings(records, window, "copy_params_to_host")
    assert sum(a["bytes"] for a in back) == STEPS * results[0]["plain3"]["device"]["params"]


def test_nvme_swap_files_as_deepspeed_lays_them_out(runs):
    results, records, root = runs
    folder = root / "nvme" / "nvme3" / "zero_stage_3" / "optimizer"
    assert sorted(os.listdir(folder)) == ["rank0", "rank1"]
    files = {f: os.path.getsize(folder / "rank0" / f) for f in os.listdir(folder / "rank0")}
    # the matrices' group: the weights, ds_ids 0, 4 and 6 (module order; the biases and norm are the others)
    assert sorted(files) == ["0_6.tensor.swp", "exp_avg-0_6.tensor.swp", "exp_avg_sq-0_6.tensor.swp"]
    mine = (4096 + 524288 + 4096) // 2 * 4
    assert set(files.values()) == {-(-mine // 1024) * 1024}
    # stages 1-2 take "nvme" as DeepSpeed's do: states in host memory, no files
    assert not (root / "nvme" / "nvme2").exists()
    window = results[0]["nvme3"]["window"]
    assert len(_crossings(records, window, "swap_in_optimizer_state")) == STEPS


@pytest.mark.parametrize("zero, message", [
    ({"stage": 2, "offload_optimizer": {"device": "nvme"}}, "needs nvme_path"),
    ({"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}, "only supported for ZeRO stage 3"),
    ({"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}, "not built"),
    ({"stage": 2, "cpu_offload": True, "offload_optimizer": {"device": "cpu"}}, "together"),
    ({"stage": 0, "offload_optimizer": {"device": "cpu"}}, "stage 1, 2 or 3"),
    ({"stage": 2, "offload_optimizer": {"device": "gpu"}}, "must be \"none\", \"cpu\" or \"nvme\""),
    ({"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/t", "super_offload": True}}, "Grace-Hopper"),
])
def test_refusals_name_the_key(zero, message):
    with pytest.raises(DeepSpeedConfigError, match=message):
        DeepSpeedConfig({"train_batch_size": 2, "zero_optimization": zero})


def test_deprecated_keys_resolve_as_deepspeed_resolves_them():
    zero = DeepSpeedConfig({"train_batch_size": 2, "zero_optimization": {
        "stage": 3, "cpu_offload": True, "cpu_offload_param": "yes", "cpu_offload_use_pin_memory": False}}).zero_config
    assert (zero.offload_optimizer.device, zero.offload_param.device) == ("cpu", "cpu")
    assert zero.offload_optimizer.pin_memory   # the deprecated pin key sets nothing
    off = DeepSpeedConfig({"train_batch_size": 2, "zero_optimization": {"stage": 2, "cpu_offload": False}})
    assert off.zero_config.offload_optimizer is None
    aio = DeepSpeedConfig({"train_batch_size": 2, "aio": {"block_size": 2097152, "intra_op_parallelism": 4}})
    assert (aio.aio_config.min_swap_bytes, aio.aio_config.aligned_bytes) == (2097152, 4096)


GPT = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
       "--micro-batch-size", "1", "--global-batch-size", "4", "--vocab-size", "1023"]


def test_estimate_equals_what_a_traced_pretrain_moves(tmp_path):
    """pretrain --deepspeed at stage 3 with both offloads (its client optimizer allowed by
    zero_force_ds_cpu_optimizer false): estimate's bytes to host and to device equal the sums of
    the trace's copy_gradients_to_host and copy_params_to_device in the iteration, exactly."""
    from cli_here import run_minitron
    from distributed import pretrain_records
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1,
                                  "zero_force_ds_cpu_optimizer": False, "zero_optimization": {
                                      "stage": 3, "offload_optimizer": CPU, "offload_param": CPU}}))
    flags = [*GPT, "--deepspeed", "--deepspeed-config", str(config)]
    estimate = run_minitron("estimate", "--world", "2", *flags, "--json", here=True)
    assert estimate.returncode == 0, estimate.stderr
    [predicted] = json.loads(estimate.stdout)["offload"]
    pretrain_records(tmp_path / "run", 2, [*flags, "--train-iters", "1", "--lr", "1e-3", "--mock-data",
                                           "--distributed-backend", "gloo", "--eval-iters", "0"], tmp_path / "trace")
    moved = {"to host": 0, "to device": 0}
    for line in open(tmp_path / "trace" / "rank0.jsonl"):
        record = json.loads(line)
        kind = record["name"].rsplit(".", 1)[-1]
        if kind in ("copy_gradients_to_host", "copy_params_to_device"):
            moved["to host" if kind == "copy_gradients_to_host" else "to device"] += record["args"]["bytes"]
    assert moved == {k: predicted[k] for k in moved} and predicted["host"] > 0


def test_pretrain_refuses_offload_with_its_client_optimizer(tmp_path):
    from cli_here import run_minitron
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1,
                                  "zero_optimization": {"stage": 2, "offload_optimizer": CPU}}))
    done = run_minitron("estimate", "--world", "2", *GPT, "--deepspeed", "--deepspeed-config", str(config), here=True)
    assert done.returncode == 2 and "zero_force_ds_cpu_optimizer" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_chapters_table_is_this_run(runs):
    """docs/examples/offload_bytes.json (scripts/show_offload_bytes.py --write; chapter 14c) holds
    the same model's bytes: each case's device and host bytes, and one step's copies, as here."""
    results, records, _ = runs
    data = json.loads((Path(__file__).parent.parent / "docs" / "examples" / "offload_bytes.json").read_text())
    ours = {"2": "plain2", "2 opt": "optimizer2", "3": "plain3",
            "3 opt": "optimizer3", "3 param": "param3", "3 opt+param": "both3",
            "3 nvme+param": "nvme3"}
    for name, case in data["rank0"].items():
        got = results[0][ours[name]]
        assert (case["device"], case["host"]) == (got["device"], got["host"]), name
        for kind, per_step in case["moved"].items():
            assert per_step * STEPS == sum(a["bytes"] for a in _crossings(records, got["window"], kind)), (name, kind)
    assert set(data["swap_files"].values()) == {-(-(4096 + 524288 + 4096) // 2 * 4 // 1024) * 1024}
