"""fp16 training on 4 gloo ranks (tp=2, dp=2): an Inf in one rank's gradient makes *every*
rank skip the step and the dynamic loss scale back off, for the fp16 optimizer (Inf checked
over the model-parallel group) and for the distributed optimizer (checked over the world)."""

from types import SimpleNamespace

import torch

from distributed import run_ranks

INITIAL_SCALE = 2.0 ** 10


def _toy() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).half()


def _body(rank):
    from minitron.core import parallel_state as ps
    from minitron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from minitron.core.distributed.finalize_model_grads import finalize_model_grads
    from minitron.core.optimizer import (
        DistributedOptimizer, Float16OptimizerWithFloat16Params, OptimizerConfig, get_megatron_optimizer,
    )
    g = torch.Generator().manual_seed(5 + ps.get_data_parallel_rank())
    x, y = torch.randn(4, 6, generator=g).half(), torch.randn(4, 3, generator=g)
    out = {}
    for kind in ("fp16", "zero1"):
        zero1 = kind == "zero1"
        chunk = DistributedDataParallel(SimpleNamespace(sequence_parallel=False),
                                        DistributedDataParallelConfig(use_distributed_optimizer=zero1,
                                                                      grad_reduce_in_fp32=zero1), _toy())
        optimizer = get_megatron_optimizer(
            OptimizerConfig(lr=1e-2, fp16=True, initial_loss_scale=INITIAL_SCALE, hysteresis=1,
                            use_distributed_optimizer=zero1), [chunk])
        assert isinstance(optimizer, DistributedOptimizer if zero1 else Float16OptimizerWithFloat16Params)
        before = [p.detach().clone() for p in chunk.module.parameters()]
        results = []
        for step, inject in enumerate((True, False)):
            chunk.zero_grad_buffer()
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(chunk(x).float(), y)
            optimizer.scale_loss(loss).backward()
            if inject and not zero1 and rank == 1:
                # Before the DP all-reduce: it spreads to rank 1's DP partner (3); the
                # model-parallel Inf check must then stop its TP partners (0 and 2) too.
                chunk.module[0].weight.main_grad[0, 0] = float("inf")
            finalize_model_grads([chunk])
            if inject and zero1 and rank == 3:
                # After the reduce-scatter, inside rank 3's own shard: no other rank sees it.
                param, (start, _) = next(iter(optimizer.param_range_map.items()))
                param.main_grad.view(-1)[start] = float("inf")
            ok, grad_norm, _ = optimizer.step()
            unchanged = all(torch.equal(a, b) for a, b in zip(before, chunk.module.parameters()))
            results.append((ok, grad_norm is None, unchanged, optimizer.get_loss_scale().item()))
        # Main params stay fp32 while the model is fp16.
        assert all(p.dtype == torch.float32 for p in optimizer.get_parameters())
        assert all(p.dtype == torch.float16 for p in chunk.module.parameters())
        out[kind] = results

    # bf16: no loss scaler (its range is fp32's), but fp32 main params all the same. A step too
    # small for bf16's spacing leaves the model's weights as they are and moves the main copy.
    chunk = DistributedDataParallel(SimpleNamespace(sequence_parallel=False),
                                    DistributedDataParallelConfig(grad_reduce_in_fp32=True),
                                    _toy().bfloat16())
    optimizer = get_megatron_optimizer(OptimizerConfig(lr=1e-6, bf16=True, clip_grad=0.0), [chunk])
    assert optimizer.grad_scaler is None and optimizer.get_loss_scale().item() == 1.0
    weight = chunk.module[0].weight
    before_model, before_main = weight.detach().clone(), weight.main_param.detach().clone()
    chunk.zero_grad_buffer()
    optimizer.zero_grad()
    optimizer.scale_loss(torch.nn.functional.mse_loss(chunk(x.bfloat16()).float(), y)).backward()
    finalize_model_grads([chunk])
    assert optimizer.step()[0]
    out["bf16"] = (torch.equal(before_model, weight), torch.equal(before_main, weight.main_param))
    return out


def test_inf_skips_step_on_every_rank_and_backs_off():
    results = run_ranks(_body, world_size=4, tp=2)
    for rank_result in results:
        for kind in ("fp16", "zero1"):
            (ok0, no_norm0, unchanged0, scale0), (ok1, no_norm1, unchanged1, scale1) = rank_result[kind]
            assert (ok0, no_norm0, unchanged0) == (False, True, True), kind   # skipped everywhere
            assert scale0 == INITIAL_SCALE / 2                                  # hysteresis=1: halve now
            assert (ok1, no_norm1, unchanged1) == (True, False, False), kind   # the next step works
            assert scale1 == INITIAL_SCALE / 2                                  # no growth after 1 step
        assert rank_result["bf16"] == (True, False)   # model weight unchanged, main param moved
