"""DDP on gloo ranks (tp=1, dp=world): averaged gradients equal the serial gradient of the
whole batch, with one bucket or many, overlapped or not, and with no_sync accumulation."""

from types import SimpleNamespace

import pytest
import torch

from distributed import run_ranks
from toy_models import toy_mlp

IN, OUT, PER_RANK = 6, 3, 4


def _toy(seed: int) -> torch.nn.Module:
    return toy_mlp(seed, IN, OUT)


def _batch(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, IN, generator=g), torch.randn(n, OUT, generator=g)


def _loss(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def _serial_grads(x, y, seed=0):
    model = _toy(seed)
    _loss(model, x, y).backward()
    return [p.grad for p in model.parameters()]


def _body(world: int, ddp_kwargs: dict):
    def body(rank):
        from minitron.core import parallel_state as ps
        from minitron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from minitron.core.distributed.finalize_model_grads import finalize_model_grads
        dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        assert dp == world
        # Replicas start different on purpose: broadcast_params must make them rank 0's.
        ddp = DistributedDataParallel(SimpleNamespace(sequence_parallel=False),
                                      DistributedDataParallelConfig(**ddp_kwargs), _toy(seed=rank))
        ddp.broadcast_params()
        for mine, ref in zip(ddp.module.parameters(), _toy(seed=0).parameters()):
            assert torch.equal(mine, ref)
        overlap = ddp_kwargs.get("overlap_grad_reduce", False)

        # 1. One micro-batch per rank: the average of the ranks' gradients is the gradient
        #    of the mean loss over the concatenated batch.
        x, y = _batch(PER_RANK * dp, seed=1)
        mine = slice(dp_rank * PER_RANK, (dp_rank + 1) * PER_RANK)
        ddp.zero_grad_buffer()
        _loss(ddp, x[mine], y[mine]).backward()
        # The first iteration only learns which gradients each bucket waits for (Megatron's
        # rule): nothing is launched from backward yet.
        assert all(g.grad_reduce_handle is None for g in ddp.bucket_groups)
        finalize_model_grads([ddp])
        for param, ref in zip(ddp.module.parameters(), _serial_grads(x, y)):
            assert param.grad is None   # the hook moved it into the buffer
            torch.testing.assert_close(param.main_grad, ref, rtol=0, atol=1e-6)

        # 2. Gradient accumulation: three micro-batches, the first two under no_sync, each
        #    loss divided by their number (as the schedules do), equal one big batch.
        m = 3
        x, y = _batch(m * PER_RANK * dp, seed=2)
        ddp.zero_grad_buffer()
        for k in range(m):
            rows = slice((k * dp + dp_rank) * PER_RANK, (k * dp + dp_rank + 1) * PER_RANK)
            if k < m - 1:
                with ddp.no_sync():
                    (_loss(ddp, x[rows], y[rows]) / m).backward()
                # Nothing may have been sent while accumulating.
                assert all(g.grad_reduce_handle is None for g in ddp.bucket_groups)
            else:
                (_loss(ddp, x[rows], y[rows]) / m).backward()
                in_flight = sum(g.grad_reduce_handle is not None for g in ddp.bucket_groups)
        finalize_model_grads([ddp])
        for param, ref in zip(ddp.module.parameters(), _serial_grads(x, y)):
            torch.testing.assert_close(param.main_grad, ref, rtol=0, atol=1e-6)
        if overlap:
            _same_steps_as_synchronous(ddp, DistributedDataParallel, DistributedDataParallelConfig,
                                       finalize_model_grads, dp_rank)
        return {"buckets": len(ddp.bucket_groups), "in_flight": in_flight, "overlap": overlap}
    return body


def _same_steps_as_synchronous(ddp, DDP, Config, finalize, dp_rank):
    """Overlapping moves when each bucket is reduced, not what it sums: three SGD steps with the
    overlapped buckets and with one synchronous all-reduce give equal gradients and weights, bit
    for bit (dp 2: each element is one a + b either way)."""
    sync = DDP(SimpleNamespace(sequence_parallel=False), Config(), _toy(seed=0))
    with torch.no_grad():
        for mine, theirs in zip(sync.module.parameters(), ddp.module.parameters()):
            mine.copy_(theirs)
    for step in range(3):
        x, y = _batch(PER_RANK * 2, seed=10 + step)
        rows = slice(dp_rank * PER_RANK, (dp_rank + 1) * PER_RANK)
        for model in (ddp, sync):
            model.zero_grad_buffer()
            _loss(model, x[rows], y[rows]).backward()
            finalize([model])
            with torch.no_grad():
                for param in model.module.parameters():
                    param -= 0.1 * param.main_grad
        for mine, theirs in zip(ddp.module.parameters(), sync.module.parameters()):
            assert torch.equal(mine.main_grad, theirs.main_grad) and torch.equal(mine, theirs)


@pytest.mark.parametrize("world, ddp_kwargs", [
    (2, dict(overlap_grad_reduce=True, bucket_size=100)),
    (4, dict(overlap_grad_reduce=False, average_in_collective=True)),
])
def test_ddp_average_equals_serial(world, ddp_kwargs):
    results = run_ranks(_body(world, ddp_kwargs), world_size=world)
    for r in results:
        if r["overlap"]:
            # Small buckets, and (from the second iteration on) their all-reduces were
            # launched during backward already.
            assert r["buckets"] > 1 and r["in_flight"] == r["buckets"]
        else:
            assert r["buckets"] == 1 and r["in_flight"] == 0
