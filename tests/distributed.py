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


def in_fork(fn, *args, timeout: float = 600):
    """``fn(*args)`` in a forked copy of this process; what it returns (pickled) comes back.

    For a script's code that patches modules while it runs (and must leave this worker as it
    was) without a fresh interpreter: one costs ~2.5 s of CPU for torch's imports, a fork of
    this warm process ~0.01 s. What it prints goes to a log whose tail an AssertionError carries
    if it raises or exits non-zero."""
    import os
    import pickle
    import signal
    import sys
    import tempfile
    import time
    import traceback

    with tempfile.TemporaryDirectory(prefix="minitron-fork-") as scratch:
        log, result = Path(scratch) / "log", Path(scratch) / "result.pkl"
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:   # the child: never returns into pytest's code
            code = 1
            try:
                os.setsid()   # its own process group, so a timeout stops what it started too
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                sys.stdout = open(1, "w", buffering=1, closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                result.write_bytes(pickle.dumps(fn(*args)))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                print(f"in_fork: SystemExit({exc.code!r})", file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        deadline = time.monotonic() + timeout
        while not (status := os.waitpid(pid, os.WNOHANG))[0]:
            if time.monotonic() > deadline:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"in_fork: {fn.__name__} ran past {timeout} s\n{log.read_text()[-3000:]}")
            time.sleep(0.01)
        code = os.waitstatus_to_exitcode(status[1])
        if code != 0 or not result.exists():
            raise AssertionError(f"in_fork: {fn.__name__} exited {code}\n{log.read_text()[-3000:]}")
        return pickle.loads(result.read_bytes())


def pretrain_records_each(out: Path, world: int, argvs: dict[str, list[str]]) -> dict[str, list[dict]]:
    """pretrain_records for several runs on one set of ``world`` forked ranks: each rank runs
    pretrain_gpt with each ``argvs`` entry in turn, leaving the world to the next; their
    iterations.jsonl records by name. Fresh ranks for every run cost 0.1-0.2 s of CPU more a run
    (forking, joining the world, the first touch of the parent's pages); nothing of a run
    outlives destroy_global_state, so each computes what it would alone.

    A failing run fails the test with the tail of its rank's log, which names the run."""
    out.mkdir(parents=True)
    argvs = {name: [*argv, "--log-jsonl", str(out / f"{name}.jsonl")] for name, argv in argvs.items()}

    def body(rank):
        from minitron.pretrain_gpt import run_main
        from minitron.training.training import destroy_global_state

        for name, argv in argvs.items():
            print(f"--- {name}", flush=True)
            run_main(argv)
            destroy_global_state(world=False)   # the harness leaves the world itself
    run_ranks(body, world_size=world, tp=None)
    return {name: [json.loads(line) for line in open(out / f"{name}.jsonl")] for name in argvs}


def run_each(root: Path, world: int, bodies: dict, trace: bool = True) -> dict[str, list]:
    """Several rank bodies on one set of ``world`` forked ranks: each rank runs each
    ``bodies[name](rank)`` in turn (each initializing Megatron itself), traced into
    ``root / name / "trace"`` unless ``trace`` is False, and leaves nothing of it to the next
    (destroy_global_state); what each returned, by name, in rank order. Fresh ranks for every
    body cost 0.1-0.2 s of CPU more a body (forking, joining the world, the first touch of the
    parent's pages). A failing body fails the test with its rank's log tail, which names it."""
    def body(rank):
        from minitron import trace as recorder
        from minitron.training.training import destroy_global_state

        out = {}
        for name, each in bodies.items():
            print(f"--- {name}", flush=True)
            if trace:
                recorder.start(root / name / "trace", rank)
            try:
                out[name] = each(rank)
            finally:
                if trace:
                    recorder.stop()
                destroy_global_state(world=False)   # the harness leaves the world itself
        return out
    cfg = LaunchConfig(world_size=world, log_dir=root / f"logs-{world}")
    try:
        held = run_on_ranks(body, cfg)
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(40)}") from None
    return {name: [h[name] for h in held] for name in bodies}
