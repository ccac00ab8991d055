"""The files the engine's save_checkpoint writes, on two forked gloo ranks: DeepSpeed 0.19.8's
layout (minitron/runtime/checkpoint/; tests/test_ds_peer.py compares it with DeepSpeed's own).

    python scripts/show_ds_checkpoint.py

Each run trains a small MLP one step with Adam and saves; the listing is the checkpoint folder,
then the keys of rank 0's model-states file.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

RUNS = ((0, "fp32"), (1, "bf16"), (3, "fp32"))   # no optimizer files; the bf16_ prefix; per-rank models
WORLD = 2


def _save_all(root: str):
    def body(rank: int) -> None:
        import torch

        from minitron.runtime import initialize
        for stage, precision in RUNS:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3))
            config = {"train_batch_size": 4, "zero_optimization": {"stage": stage},
                      "optimizer": {"type": "Adam", "params": {"lr": 0.01}}}
            if precision == "bf16":
                config["bf16"] = {"enabled": True}
            engine, *_ = initialize(model=model, config=config)
            x = torch.randn(2, 6, generator=torch.Generator().manual_seed(rank)).to(next(model.parameters()).dtype)
            engine.backward(engine(x).float().pow(2).mean())
            engine.step()
            engine.save_checkpoint(f"{root}/stage{stage}_{precision}")
    return body


def main() -> int:
    import torch

    from minitron.launcher import LaunchConfig, RankFailure, run_on_ranks
    with tempfile.TemporaryDirectory() as root:
        try:
            run_on_ranks(_save_all(root), LaunchConfig(world_size=WORLD))
        except RankFailure as failure:
            print(f"{failure}\n{failure.log_tail(20)}", file=sys.stderr)
            return 1
        for stage, precision in RUNS:
            where = Path(root) / f"stage{stage}_{precision}"
            print(f"ZeRO stage {stage}, {precision}, {WORLD} ranks, saved after one step:")
            for path in sorted(p for p in where.rglob("*") if p.is_file()):
                print(f"  {path.relative_to(where)}")
            print()
        model = torch.load(Path(root) / "stage0_fp32" / "global_step1" / "mp_rank_00_model_states.pt",
                           weights_only=False)
        print("keys of mp_rank_00_model_states.pt:")
        keys, line = list(model), "  "
        for key in keys:
            if len(line) + len(key) + 2 > 90:
                print(line.rstrip())
                line = "  "
            line += key + ", "
        print(line.rstrip(", "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
