"""Adam steps on gloo ranks (tp=1, dp=world): DDP + the plain optimizer and DDP + the
distributed optimizer (ZeRO-1) both follow serial AdamW on the whole batch, with weight-decay
groups, gradient clipping and a warm-up schedule; ZeRO-1 keeps only its shard of the state."""

from types import SimpleNamespace

import pytest
import torch

from distributed import run_ranks
from toy_models import toy_mlp

IN, OUT, PER_RANK, STEPS, LR, WD, CLIP = 6, 3, 4, 3, 0.05, 0.1, 0.5


def _toy(seed: int) -> torch.nn.Module:
    return toy_mlp(seed, IN, OUT)


def _batch(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, IN, generator=g), 3 * torch.randn(n, OUT, generator=g)


def _scheduler(optimizer, global_batch: int):
    from minitron.core.optimizer_param_scheduler import OptimizerParamScheduler
    # Steps counted in samples: warm-up over 2 iterations' worth, cosine decay after.
    return OptimizerParamScheduler(optimizer, init_lr=0.0, max_lr=LR, min_lr=LR / 10,
                                   lr_warmup_steps=2 * global_batch, lr_decay_steps=10 * global_batch,
                                   lr_decay_style="cosine", start_wd=WD, end_wd=WD, wd_incr_steps=1,
                                   wd_incr_style="constant")


def _body(world: int):
    def body(rank):
        from minitron.core import parallel_state as ps
        from minitron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from minitron.core.distributed.finalize_model_grads import finalize_model_grads
        from minitron.core.optimizer import DistributedOptimizer, FP32Optimizer, OptimizerConfig, get_megatron_optimizer
        dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        global_batch = PER_RANK * dp
        chunks, optimizers, schedulers = {}, {}, {}
        for kind in ("plain", "zero1"):
            # ZeRO-1 with small buckets, reduce-scattered while backward runs.
            ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=kind == "zero1",
                                                       overlap_grad_reduce=kind == "zero1", bucket_size=200)
            chunk = DistributedDataParallel(SimpleNamespace(sequence_parallel=False), ddp_config, _toy(0))
            opt_config = OptimizerConfig(lr=LR, weight_decay=WD, clip_grad=CLIP,
                                         use_distributed_optimizer=kind == "zero1")
            chunks[kind] = chunk
            optimizers[kind] = get_megatron_optimizer(opt_config, [chunk])
            schedulers[kind] = _scheduler(optimizers[kind], global_batch)
        assert isinstance(optimizers["plain"], FP32Optimizer)
        assert isinstance(optimizers["zero1"], DistributedOptimizer)
        # Biases and the layernorm (all 1-D) are exempt from weight decay, as in Megatron.
        assert [(g["wd_mult"], len(g["params"])) for g in optimizers["plain"].param_groups] == [(1.0, 3), (0.0, 5)]

        serial = _toy(0)
        decay = [p for p in serial.parameters() if p.dim() > 1]
        no_decay = [p for p in serial.parameters() if p.dim() == 1]
        serial_opt = torch.optim.AdamW([{"params": decay, "wd_mult": 1.0},
                                        {"params": no_decay, "wd_mult": 0.0}], lr=LR, weight_decay=WD)
        serial_sched = _scheduler(serial_opt, global_batch)

        for step in range(STEPS):
            x, y = _batch(global_batch, seed=10 + step)
            mine = slice(dp_rank * PER_RANK, (dp_rank + 1) * PER_RANK)
            norms = {}
            for kind, chunk in chunks.items():
                chunk.zero_grad_buffer()
                optimizers[kind].zero_grad()
                torch.nn.functional.mse_loss(chunk(x[mine]), y[mine]).backward()
                finalize_model_grads([chunk])
                ok, norms[kind], _ = optimizers[kind].step()
                assert ok
                schedulers[kind].step(increment=global_batch)
            serial_opt.zero_grad()
            torch.nn.functional.mse_loss(serial(x), y).backward()
            norms["serial"] = torch.nn.utils.clip_grad_norm_(serial.parameters(), CLIP).item()
            serial_opt.step()
            serial_sched.step(increment=global_batch)
            assert norms["serial"] > CLIP   # clipping really happens in this test
            for kind in chunks:
                assert norms[kind] == pytest.approx(norms["serial"], rel=1e-5)
                for mine_p, ref in zip(chunks[kind].module.parameters(), serial.parameters()):
                    torch.testing.assert_close(mine_p, ref, rtol=0, atol=1e-6)

        zero1 = optimizers["zero1"]
        state_numel = sum(s["exp_avg"].numel() for s in zero1.state.values())
        buffer = chunks["zero1"].buffers[0]
        assert len(buffer.buckets) > 1
        shard_sizes = [(e - s) // dp for s, e in buffer.bucket_indices]
        return {"state_numel": state_numel, "buffer_numel": buffer.numel, "max_shards": sum(shard_sizes),
                "params_numel": sum(p.numel() for p in serial.parameters()),
                "plain_state_numel": sum(s["exp_avg"].numel() for s in optimizers["plain"].state.values()),
                "ranges": {buffer.param_index_map[p][0] + s: buffer.param_index_map[p][0] + e
                           for p, (s, e) in zero1.param_range_map.items()},
                "lr": optimizers["plain"].param_groups[0]["lr"], "serial_lr": serial_opt.param_groups[0]["lr"]}
    return body


@pytest.mark.parametrize("world", [2, 4])
def test_adam_ddp_and_zero1_match_serial(world):
    results = run_ranks(_body(world), world_size=world)
    total = results[0]["params_numel"]
    # ZeRO-1: the ranks' Adam moments together cover every parameter exactly once, each rank
    # holding at most its shard (1/dp of the padded buffer); the plain optimizer holds it all.
    assert sum(r["state_numel"] for r in results) == total
    for r in results:
        assert 0 < r["state_numel"] <= r["max_shards"] == r["buffer_numel"] // world
        assert r["plain_state_numel"] == total
        assert r["lr"] == r["serial_lr"]
    owned = sorted((s, e) for r in results for s, e in r["ranges"].items())
    assert all(prev_end <= start for (_, prev_end), (start, _) in zip(owned, owned[1:]))
