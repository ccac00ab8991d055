"""Context parallelism on real gloo ranks. Chapter 15 runs this.

    python docs/examples/cp_demo.py layout    # which tokens each cp rank holds (get_batch_on_this_cp_rank)
    python docs/examples/cp_demo.py ring [FILE]     # the ring's steps on each rank, its answer against plain attention
    python docs/examples/cp_demo.py balance [FILE]  # blocks computed per rank: balanced split against contiguous one
    python docs/examples/cp_demo.py messages DIR   # the ring's messages in a `minitron trace --steps 1` directory
    python docs/examples/cp_demo.py train          # a tiny GPT trained serially and with cp 2 x tp 2: lm loss per iteration

`ring` and `balance` start 4 forked gloo ranks with Megatron's groups (cp = 4) and call the
attention every GPT layer calls, attn_forward_func_with_cp, in both layouts; the counts are what
its forward loop did, returned in its ``stats``. Given a FILE, `ring` keeps what the ranks
returned there and `balance` reads it back, so a page that shows both starts the ranks once.
"""

from __future__ import annotations

import sys

import torch

CP = 4
SEQ = 32 * 2 * CP


def layout() -> None:
    from minitron.training.utils import get_batch_on_this_cp_rank

    seq = 16
    for cp in (2, 4):
        print(f"seq-length {seq}, context-parallel-size {cp}: {2 * cp} chunks of {seq // (2 * cp)} tokens")
        positions = torch.arange(seq).view(1, seq)
        for r in range(cp):
            held = get_batch_on_this_cp_rank({"position_ids": positions}, cp_rank=r, cp_size=cp)["position_ids"]
            print(f"  cp rank {r}: positions {held[0].tolist()}")


def _chunks_of(t: torch.Tensor, ids, cp: int) -> torch.Tensor:
    """[b, n, s, d] -> the two chunks ``ids`` of the 2cp, along s."""
    return torch.cat([t.chunk(2 * cp, dim=2)[i] for i in ids], dim=2)


def _on_rank(rank: int, seq: int, layouts) -> dict:
    from minitron.core import parallel_state as ps
    from minitron.core.transformer.context_parallel import attn_forward_func_with_cp, chunk_ids, ring_plan

    torch.set_num_threads(1)
    cp, r = ps.get_context_parallel_world_size(), ps.get_context_parallel_rank()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, seq, 32, generator=g) for _ in range(3))  # the same on every rank
    scale = 32 ** -0.5
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    result = {"plan": ring_plan(r, cp)}
    for name in layouts:
        ids = chunk_ids(r, cp, name)
        stats = {}
        out = attn_forward_func_with_cp(*(_chunks_of(t, ids, cp) for t in (q, k, v)), scale, layout=name,
                                        stats=stats)
        stats["error"] = (out - _chunks_of(expected, ids, cp)).abs().max().item()
        stats["chunks"] = ids
        result[name] = stats
    return result


def _run(saved: str | None = None) -> list:
    """Every rank's plan and, per layout, its stats; from ``saved`` when an earlier call kept them."""
    import json
    from pathlib import Path

    if saved and Path(saved).exists():
        return json.loads(Path(saved).read_text())
    sys.path.insert(0, "tests")
    from distributed import run_ranks

    results = run_ranks(lambda rank: _on_rank(rank, SEQ, ["contiguous", "balanced"]), world_size=CP, cp=CP)
    if saved:
        Path(saved).parent.mkdir(parents=True, exist_ok=True)
        Path(saved).write_text(json.dumps(results))
    return results


def ring(saved: str | None = None) -> None:
    if saved:
        from pathlib import Path
        Path(saved).unlink(missing_ok=True)  # this command is the one that runs the ranks
    results = _run(saved)
    print(f"cp = {CP}: each rank holds 2 of {2 * CP} chunks; step t brings the keys/values of rank r-t")
    for rank, result in enumerate(results):
        print(f"cp rank {rank}, query chunks {list(result['balanced']['chunks'])}")
        for step, (source, pairs) in enumerate(result["plan"]):
            kinds = ", ".join(f"q{qi}·k{ki} {kind}" for qi, ki, kind in pairs)
            print(f"  step {step}: keys of rank {source}: {kinds}")
    worst = max(r["balanced"]["error"] for r in results)
    print(f"largest |ring - plain causal attention| over all ranks: {worst:.1e}")


def balance(saved: str | None = None) -> None:
    results = _run(saved)
    print(f"seq-length {SEQ}, cp = {CP}: chunks of {SEQ // (2 * CP)} tokens")
    print("work in half-blocks: a full block is 2, a diagonal one 1")
    print("layout      cp rank  chunks   full  diagonal  skipped  work  |error|")
    for name in ("contiguous", "balanced"):
        for rank, result in enumerate(results):
            s = result[name]
            work = 2 * s.get("full", 0) + s.get("diagonal", 0)  # in half-blocks: a diagonal is half a full
            print(f"{name:<11} {rank:>7}  {str(list(s['chunks'])):<7} {s.get('full', 0):>5} {s.get('diagonal', 0):>9} "
                  f"{s.get('skipped', 0):>8} {work:>5}  {s['error']:.0e}")
        works = [2 * r[name].get("full", 0) + r[name].get("diagonal", 0) for r in results]
        print(f"{name:<11} busiest rank / mean: {max(works) / (sum(works) / len(works)):.2f}")


def messages(trace_dir: str) -> None:
    """Every batch_isend_irecv on the context-parallel group, by rank and by the step that
    posted it (the ring's forward or its backward), with each op's peer and shape; and every
    all_to_all_single there (--cp-comm-type a2a), by the step that called it, with its shape."""
    import json
    from collections import Counter
    from pathlib import Path

    for path in sorted(Path(trace_dir).glob("rank*.jsonl")):
        records = [json.loads(line) for line in path.open()]
        names = {r["id"]: r["name"].rsplit(".", 2)[-2:] for r in records}
        seen = Counter()
        for r in records:
            if r["name"].endswith("batch_isend_irecv") and r["args"].get("group") == "CONTEXT_PARALLEL_GROUP":
                caller = ".".join(n for n in names[r["parent"]] if n != "context_parallel")
                ops = ", ".join(f"{o['op']} {'to' if o['op'] == 'isend' else 'from'} {o['peer']}"
                                for o in r["args"]["ops"])
                shapes = {str(o["shape"]) for o in r["args"]["ops"]}
                seen[(caller, ops, " / ".join(sorted(shapes)))] += 1
            elif r["name"].endswith("all_to_all_single") and r["args"].get("group") == "CONTEXT_PARALLEL_GROUP":
                caller = ".".join(n for n in names[r["parent"]] if n != "context_parallel_a2a")
                seen[(caller, "all_to_all_single", str(r["args"]["input_shape"]))] += 1
        print(f"rank {records[0]['rank']}:")
        for (caller, ops, shapes), count in seen.items():
            print(f"  {count:>2} x {caller:<31} {ops}, {shapes} each")


# The model of tests/test_context_parallel.py: dropout off, and 1023 tokens + end-of-document pad
# to the same 1024 rows for tp 1 and tp 2, so the serial and the parallel run are one model.
TRAIN = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "3", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo"]


def losses_of(runs: dict, common: list) -> dict:
    """{name: lm loss per iteration} of pretrain_gpt run on forked gloo ranks (the launcher's
    API, as the tests run it) for each name: (world, flags), read from its iterations.jsonl."""
    import json
    import tempfile
    from pathlib import Path

    from minitron.launcher import LaunchConfig, Target, launch

    losses = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (world, flags) in runs.items():
            out = Path(tmp) / name.replace(" ", "").replace(",", "")
            argv = common + flags + ["--log-jsonl", str(out / "iterations.jsonl")]
            launch(LaunchConfig(world_size=world, log_dir=out / "logs"), Target(module="minitron.pretrain_gpt", argv=argv))
            losses[name] = [json.loads(line)["lm_loss"] for line in (out / "iterations.jsonl").open()]
    return losses


def train() -> None:
    """pretrain_gpt serially, with cp 2 x tp 2, and the same with the all-to-all."""
    cp_tp = ["--context-parallel-size", "2", "--tensor-model-parallel-size", "2"]
    runs = {"serial": (1, []), "cp 2 x tp 2": (4, cp_tp), "the same, a2a": (4, cp_tp + ["--cp-comm-type", "a2a"])}
    losses = losses_of(runs, TRAIN)
    print(f"iteration  {'serial':>12}  {'cp 2 x tp 2':>12}  {'the same, a2a':>13}  largest relative difference")
    for i, (a, b, c) in enumerate(zip(*losses.values()), start=1):
        print(f"{i:>9}  {a:>12.9f}  {b:>12.9f}  {c:>13.9f}  {max(abs(b - a), abs(c - a)) / abs(a):.1e}")


if __name__ == "__main__":
    {"layout": layout, "ring": ring, "balance": balance, "messages": messages, "train": train}[sys.argv[1]](*sys.argv[2:])
