"""Where a rank's bytes live under ZeRO-Offload and ZeRO-Infinity, measured on two forked gloo ranks.

    python scripts/show_offload_bytes.py            # the tables, from docs/examples/offload_bytes.json
    python scripts/show_offload_bytes.py --write    # run the ranks again and rewrite that file
    python scripts/show_offload_bytes.py --trace DIR   # a traced run's crossings, rank by rank

Each rank builds the same MLP (532,480 weights in matrices, 2,564 in biases and a norm), hands the
two param groups to minitron.runtime.initialize() with torch's AdamW (``torch_adam``: the same
optimizer on host or device, so every case computes the same numbers), trains two steps traced,
and reports what its engine holds between steps on the device (bytes_held) and on the host
(host_bytes_held), what the second step's traced copies moved across (copy_gradients_to_host,
copy_params_to_device, copy_params_to_host), and, for NVMe, the swap folder as the run leaves it.
tests/test_ds_offload.py runs the same cases and holds this file's numbers.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

JSON = Path(__file__).resolve().parent.parent / "docs" / "examples" / "offload_bytes.json"
CPU = {"device": "cpu"}
CASES = {   # name (the stage, what is offloaded): (stage, extra zero_optimization keys)
    "2": (2, {}),
    "2 opt": (2, {"offload_optimizer": CPU}),
    "3": (3, {}),
    "3 opt": (3, {"offload_optimizer": CPU}),
    "3 param": (3, {"offload_param": CPU}),
    "3 opt+param": (3, {"offload_optimizer": CPU, "offload_param": CPU}),
    "3 nvme+param": (3, {"offload_optimizer": {"device": "nvme", "nvme_path": "NVME"},
                                          "offload_param": CPU}),
}
COPIES = ("copy_gradients_to_host", "copy_params_to_device", "copy_params_to_host")


def model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 512), torch.nn.Tanh(), torch.nn.LayerNorm(512),
                               torch.nn.Linear(512, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 4))


def _body(nvme: str):
    def body(rank):
        import time

        import torch
        from minitron.runtime import initialize
        out = {}
        for name, (stage, extra) in CASES.items():
            zero = json.loads(json.dumps({"stage": stage, **extra}).replace("NVME", nvme))
            net = model()
            groups = [{"params": [p for p in net.parameters() if p.dim() == 2]},
                      {"params": [p for p in net.parameters() if p.dim() < 2], "weight_decay": 0.0}]
            engine, *_ = initialize(model=net, model_parameters=groups, config={
                "train_batch_size": 4, "zero_optimization": zero,
                "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}})
            for step in range(2):
                start = time.time() * 1e6   # the last step's window, for its copies in the trace
                g = torch.Generator().manual_seed(step)
                x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
                engine.backward(torch.nn.functional.mse_loss(engine(x[2 * rank:2 * rank + 2]), y[2 * rank:2 * rank + 2]))
                engine.step()
            out[name] = {"device": engine.bytes_held(), "host": engine.host_bytes_held(),
                         "window": [start, time.time() * 1e6]}
        return out
    return body


def measure() -> dict:
    from minitron.launcher import LaunchConfig, run_on_ranks, session_env
    with tempfile.TemporaryDirectory() as tmp:
        nvme, trace = os.path.join(tmp, "nvme"), os.path.join(tmp, "trace")
        ranks = run_on_ranks(_body(nvme), LaunchConfig(world_size=2, env=session_env(2, trace)))
        records = [json.loads(line) for line in open(os.path.join(trace, "rank0.jsonl"))]
        folder = os.path.join(nvme, "zero_stage_3", "optimizer")
        files = {f"{r}/{f}": os.path.getsize(os.path.join(folder, r, f))
                 for r in sorted(os.listdir(folder)) for f in sorted(os.listdir(os.path.join(folder, r)))}
    out = {}
    for name, got in ranks[0].items():
        moved = dict.fromkeys(COPIES, 0)
        for r in records:
            kind = r["name"].rsplit(".", 1)[-1]
            if kind in moved and got["window"][0] <= r["start_us"] <= got["window"][1]:
                moved[kind] += r["args"]["bytes"]
        out[name] = {"device": got["device"], "host": got["host"], "moved": moved}
    return {"rank0": out, "swap_files": files}


def show(data: dict) -> None:
    def kib(n: int) -> str:
        return f"{n / 1024:,.0f} KiB" if n else "0"
    head = ("ZeRO", "dev params", "dev optim", "host params", "host optim", "to host", "to device")
    rows = [(name, kib(c["device"]["params"]), kib(c["device"]["optimizer_states"]), kib(c["host"]["params"]),
             kib(c["host"]["optimizer_states"]), kib(c["moved"]["copy_gradients_to_host"] +
                                                     c["moved"]["copy_params_to_host"]),
             kib(c["moved"]["copy_params_to_device"])) for name, c in data["rank0"].items()]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    print("\nnvme_path/zero_stage_3/optimizer/ after the run:")
    for path, size in data["swap_files"].items():
        print(f"  {size:>9,} B  {path}")


def crossings(trace: str) -> None:
    """Calls and bytes of each traced copy across, per rank, over the whole run."""
    for path in sorted(Path(trace).glob("rank*.jsonl"), key=lambda p: int(p.stem[4:])):
        seen = {kind: [0, 0] for kind in COPIES}
        for line in open(path):
            record = json.loads(line)
            kind = record["name"].rsplit(".", 1)[-1]
            if kind in seen:
                seen[kind][0] += 1
                seen[kind][1] += record["args"]["bytes"]
        print(f"{path.stem}: " + ", ".join(f"{kind} x{n} = {b:,} B" for kind, (n, b) in seen.items() if n))


if __name__ == "__main__":
    if "--trace" in sys.argv[1:]:
        crossings(sys.argv[sys.argv.index("--trace") + 1])
        sys.exit(0)
    if "--write" in sys.argv[1:]:
        JSON.write_text(json.dumps(measure(), indent=1) + "\n")
    show(json.loads(JSON.read_text()))
