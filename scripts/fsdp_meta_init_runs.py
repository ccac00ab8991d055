"""--init-model-with-meta-device measured: the bytes each rank's allocator holds at most while the
model is built and wrapped by Megatron-FSDP, normally and from a meta model, written to
docs/fsdp-runs/meta_init.json for chapter 12.

    python scripts/fsdp_meta_init_runs.py        # a few seconds on 2 cores

On 4 forked ranks a 16-layer GPT (hidden 32) is built through model_setup's chunk builder and
wrapped (optim_grads_params) twice: normally, and as shapes whose units are then built one at a
time (fsdp/meta_init.py). torch.profiler's memory events (every allocation and free, with the
total live after it) give each build's peak. tests/test_fsdp_meta_init.py runs ``measure`` too
and holds the file; docs/examples/fsdp_meta_init_view.py prints it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
JSON = ROOT / "docs" / "fsdp-runs" / "meta_init.json"
LAYERS, HIDDEN, VOCAB, SEQ, WORLD = 16, 32, 128, 16, 4


def _peak_bytes(fn, trace_path):
    """(fn's result, the most bytes the CPU allocator held at once while it ran, counted from its start)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    prof.export_chrome_trace(str(trace_path))
    events = [e["args"] for e in json.load(open(trace_path))["traceEvents"] if e.get("name") == "[memory]"]
    start = events[0]["Total Allocated"] - events[0]["Bytes"]
    return result, max(e["Total Allocated"] for e in events) - start


def measure(out: Path) -> list[dict]:
    """Each rank's peaks and sizes, in bytes, and whether the two builds' weights are equal."""
    from distributed import run_ranks

    def body(rank):
        import torch

        from minitron.core.distributed.fsdp import FullyShardedDataParallel
        from minitron.core.models.gpt import GPTModel
        from minitron.core.transformer import TransformerConfig
        from minitron.training.model_setup import _chunk_builder

        config = TransformerConfig(num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=4, init_seed=5)

        def provider(pre_process, post_process, vp_stage):
            return GPTModel(config, VOCAB, SEQ, pre_process, post_process, position_embedding_type="rope")

        def normal():
            return FullyShardedDataParallel(config, _chunk_builder(provider, None)(), "optim_grads_params")

        def meta():
            build = _chunk_builder(provider, None)
            return FullyShardedDataParallel(config, build(keep=lambda index: False), "optim_grads_params",
                                            rebuild=build)

        plain, plain_peak = _peak_bytes(normal, out / f"normal{rank}.json")
        shaped, meta_peak = _peak_bytes(meta, out / f"meta{rank}.json")
        with plain.gathered():
            want = {k: v.clone() for k, v in plain.module.state_dict().items()}
        with shaped.gathered():
            same = all(torch.equal(v, want[k]) for k, v in shaped.module.state_dict().items())
        return {"normal_peak": plain_peak, "meta_peak": meta_peak, "same": same,
                "model": sum(u.numel for u in plain.units) * 4,
                "shards": sum(u.shard_size for u in plain.units) * 4,
                "unit": max(u.flat.numel() for u in plain.units) * 4,
                "meta_left": [n for n, p in shaped.module.named_parameters() if p.is_meta]}

    return run_ranks(body, world_size=WORLD)


def main() -> None:
    ranks = measure(Path(tempfile.mkdtemp(prefix="meta_init_")))
    JSON.parent.mkdir(parents=True, exist_ok=True)
    JSON.write_text(json.dumps({"layers": LAYERS, "hidden": HIDDEN, "world": WORLD, "rank0": ranks[0]}, indent=1)
                    + "\n")
    print(f"wrote {JSON.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
