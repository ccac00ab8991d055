"""ZeRO-Infinity's parameter swapping (offload_param device "nvme") against "cpu", measured on two
forked gloo ranks.

    python scripts/show_param_swap.py            # the table, from docs/examples/param_swap.json
    python scripts/show_param_swap.py --write    # run the ranks again and rewrite that file

Each rank builds chapter 14c's MLP (its 512 x 1024 weight, ds_id 4, is the one parameter whose
piece reaches the 1 MiB swap floor: 262,144 fp32 elements a rank), trains three steps at stage 3
with torch's AdamW, traced, once per case: the pieces in host memory ("cpu"), on NVMe with
max_in_cpu 0 (every sub-group past it), on NVMe with max_in_cpu's default (1e9 elements: all
fit in memory), and on NVMe with the optimizer's states swapped too. It reports rank 0's losses,
its host bytes between steps, its swap files, and the swap_in/swap_out calls of the traced run.
tests/test_ds_param_swap.py runs the same cases and holds this file's bytes.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the offload script beside this one, from any cwd
from show_offload_bytes import model  # noqa: E402 (chapter 14c's MLP: the same one, swapped to files here)

JSON = Path(__file__).resolve().parent.parent / "docs" / "examples" / "param_swap.json"
STEPS = 3
NVME = {"device": "nvme", "nvme_path": "NVME", "max_in_cpu": 0}
CASES = {"cpu": {"offload_param": {"device": "cpu"}},
         "nvme": {"offload_param": NVME},
         "nvme_default": {"offload_param": {**NVME, "max_in_cpu": 1_000_000_000}},
         "both_nvme": {"offload_param": NVME, "offload_optimizer": {"device": "nvme", "nvme_path": "NVME"}}}
LABELS = {"cpu": "cpu", "nvme": "nvme, max_in_cpu 0", "nvme_default": "nvme, max_in_cpu 1e9",
          "both_nvme": "nvme + optimizer nvme"}
SWAPS = ("AsyncPartitionedParameterSwapper.swap_in", "AsyncPartitionedParameterSwapper.swap_out")


def _body(root: str):
    def body(rank):
        import time

        import torch
        import torch.distributed as dist
        from minitron.runtime import initialize
        out = {}
        for name, extra in CASES.items():
            zero = json.loads(json.dumps({"stage": 3, **extra}).replace("NVME", f"{root}/{name}"))
            net = model()
            engine, *_ = initialize(model=net, model_parameters=net.parameters(), config={
                "train_batch_size": 4, "zero_optimization": zero,
                "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "weight_decay": 0.01, "torch_adam": True}}})
            start, losses = time.time() * 1e6, []
            for step in range(STEPS):
                g = torch.Generator().manual_seed(step)
                x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
                rows = slice(2 * rank, 2 * rank + 2)
                loss = engine.backward(torch.nn.functional.mse_loss(engine(x[rows]), y[rows]))
                engine.step()
                t = loss.detach().clone()
                dist.all_reduce(t)
                losses.append(t.item())
            out[name] = {"losses": losses, "host": engine.host_bytes_held(), "window": [start, time.time() * 1e6],
                         "nvme": engine.optimizer.nvme_bytes_held()}
            engine.optimizer.gather(list(net.parameters()))
            out[name]["weights"] = [p.detach().clone() for p in net.parameters()]
        return out
    return body


def run(root: str) -> tuple[list, list]:
    """Every rank's results and rank 0's trace records."""
    from minitron.launcher import LaunchConfig, run_on_ranks, session_env
    trace = os.path.join(root, "trace")
    ranks = run_on_ranks(_body(os.path.join(root, "nvme")), LaunchConfig(world_size=2, env=session_env(2, trace)))
    return ranks, [json.loads(line) for line in open(os.path.join(trace, "rank0.jsonl"))]


def summary(ranks: list, records: list, root: str) -> dict:
    """Rank 0's numbers per case: losses, host parameter bytes, bytes in files, the swap calls."""
    out = {}
    for name, got in ranks[0].items():
        calls = {kind: [0, 0] for kind in SWAPS}
        for r in records:
            kind = next((k for k in SWAPS if r["name"].endswith(k)), None)
            if kind is not None and got["window"][0] <= r["start_us"] <= got["window"][1]:
                calls[kind][0] += 1
                calls[kind][1] += r["args"]["bytes"]
        folder = os.path.join(root, "nvme", name, "zero_stage_3", "float32params", "rank0")
        files = {f: os.path.getsize(os.path.join(folder, f)) for f in sorted(os.listdir(folder))} \
            if os.path.isdir(folder) else {}
        out[name] = {"losses": got["losses"], "host params": got["host"]["params"], "in files": got["nvme"]["params"],
                     "files": files, "swaps": {k.rsplit(".", 1)[1]: v for k, v in calls.items()}}
    return out


def show(data: dict) -> None:
    def kib(n: int) -> str:
        return f"{n / 1024:,.0f} KiB" if n else "0"
    head = ("offload_param", "host params", "in files", "swap_in", "swap_out")
    rows = [(LABELS[name], kib(c["host params"]), kib(c["in files"]),
             *(f"{n} calls, {kib(b)}" if n else "0" for n, b in (c["swaps"]["swap_in"], c["swaps"]["swap_out"])))
            for name, c in data.items()]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    losses = {tuple(c["losses"]) for c in data.values()}
    if len(losses) == 1:   # the point of the comparison: said only when every case agrees to the bit
        print("\nrank 0's losses, the same in every case to the bit:\n  " + " ".join(repr(x) for x in losses.pop()))
    else:
        for name, c in data.items():
            print(f"losses, {LABELS[name]}: " + " ".join(repr(x) for x in c["losses"]))
    print("\nnvme_path/zero_stage_3/float32params/rank0/ (max_in_cpu 0):")
    for path, size in data["nvme"]["files"].items():
        print(f"  {size:>9,} B  {path}")


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as tmp:
            ranks, records = run(tmp)
            JSON.write_text(json.dumps(summary(ranks, records, tmp), indent=1) + "\n")
    show(json.loads(JSON.read_text()))
