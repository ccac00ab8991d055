"""Chapter 12's --init-model-with-meta-device numbers: what scripts/fsdp_meta_init_runs.py committed.

    python docs/examples/fsdp_meta_init_view.py

Rank 0's allocator peak while the model is built and wrapped by Megatron-FSDP, normally and
from a meta model, beside the sizes that bound them.
"""

from __future__ import annotations

import json
from pathlib import Path

RUNS = json.loads((Path(__file__).resolve().parents[1] / "fsdp-runs" / "meta_init.json").read_text())


def main() -> None:
    r = RUNS["rank0"]
    kib = lambda n: f"{n / 1024:6.0f} KiB"   # noqa: E731 -- one format for every row
    print(f"{RUNS['layers']}-layer GPT, hidden {RUNS['hidden']}, dp {RUNS['world']}, optim_grads_params; rank 0")
    rows = [("the whole model (fp32)", r["model"]),
            ("its shards: parameters + gradients (2/dp)", 2 * r["shards"]),
            ("the largest unit (a layer)", r["unit"]),
            ("build peak, normal init", r["normal_peak"]),
            ("build peak, --init-model-with-meta-device", r["meta_peak"])]
    for what, n in rows:
        print(f"  {what:<44}{kib(n)}")
    print(f"  the same weights, bit for bit: {r['same']}")


if __name__ == "__main__":
    main()
