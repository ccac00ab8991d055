"""Run a test body on W forked gloo ranks, with Megatron's groups built, and bring each rank's
return value back: the launcher's run_on_ranks, plus initialize_model_parallel.

    results = run_ranks(body, world_size=4, tp=2)   # body(rank) runs on every rank
    assert results[1] == ...

Unless ``tp`` is None, each rank builds Megatron's groups before ``body`` runs. A failing
assertion inside a rank fails the test with that rank's traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from minitron.core import parallel_state as ps
from minitron.core.models.gpt import GPTModel
from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
from minitron.launcher import LaunchConfig, RankFailure, Target, launch, run_on_ranks, session_env


def run_ranks(body, world_size: int, tp: int | None = 1, pp: int = 1, cp: int = 1, ep: int = 1,
              vp: int | None = None, order: str = "tp-cp-ep-dp-pp", trace_dir: str | None = None):
    def with_groups(rank: int):
        if tp is None:
            return body(rank)
        ps.initialize_model_parallel(tp, pp, vp, context_parallel_size=cp, expert_model_parallel_size=ep,
                                     order=order)
        try:
            return body(rank)
        finally:
            ps.destroy_model_parallel()

    cfg = LaunchConfig(world_size=world_size, env=session_env(world_size, trace_dir))
    try:
        return run_on_ranks(with_groups, cfg)
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(40)}") from None


def pretrain_records(out: Path, world: int, argv: list[str], trace_dir: Path | None = None) -> list[dict]:
    """Run pretrain_gpt with ``argv`` on ``world`` forked ranks; return its iterations.jsonl records
    (``trace_dir``: the ranks also trace into it).

    A failing rank fails the test with the tail of that rank's log, not the launcher's summary."""
    out.mkdir(parents=True)
    argv = [*argv, "--log-jsonl", str(out / "iterations.jsonl")]
    cfg = LaunchConfig(world_size=world, log_dir=out / "logs", env=session_env(world, trace_dir))
    try:
        launch(cfg, Target(module="minitron.pretrain_gpt", argv=argv))
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(30)}") from None
    return [json.loads(line) for line in open(out / "iterations.jsonl")]


def rope_gpt_loss_backward(config, vocab: int, seq: int, batch: int):
    """A rope GPT of ``config`` on this rank, one seeded batch forward and backward: (model, loss).
    The tensor-parallel equivalence tests compare what it leaves against the serial run's."""
    model_parallel_cuda_manual_seed(5)
    model = GPTModel(config, vocab, seq, position_embedding_type="rope")
    g = torch.Generator().manual_seed(1)
    ids, labels = (torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(2))
    loss = model(ids, torch.arange(seq).expand(batch, seq), labels=labels)
    loss.mean().backward()
    return model, loss


def tp_shard(full, param, rank: int, tp: int):
    """This rank's slice of the serial tensor ``full``, cut as ``param`` is (whole if replicated)."""
    return full.chunk(tp, dim=param.partition_dim)[rank] if getattr(param, "tensor_model_parallel", False) else full


def train_chunk(chunk, optimizer, vocab: int, seq: int, batch: int, steps: int) -> list[float]:
    """``steps`` steps of a wrapped GPT chunk (DDP or Megatron-FSDP) on one seeded batch per
    data-parallel rank, in train_step's order: zero the buffers, forward, backward,
    finalize_model_grads, step. The losses."""
    # lazy: from the submodule, as everywhere (the package's name of it can be the module)
    from minitron.core.distributed.finalize_model_grads import finalize_model_grads

    g = torch.Generator().manual_seed(1 + ps.get_data_parallel_rank())
    ids, labels = (torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(2))
    losses = []
    for _ in range(steps):
        chunk.zero_grad_buffer()
        optimizer.zero_grad()
        loss = chunk(ids, torch.arange(seq).expand(batch, seq), labels=labels).mean()
        loss.backward()
        finalize_model_grads([chunk])
        optimizer.step()
        losses.append(loss.item())
    return losses

