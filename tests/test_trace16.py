"""`minitron trace --tp 2 --pp 4 --world 16`: Megatron's docstring layout, run for real.

One run (16 forked gloo ranks, a few seconds); the tests read its files. What the trace must
show comes from Megatron's own call path and from tests/megatron_reference.py:
  pretrain -> initialize_megatron -> ... -> _initialize_distributed
      -> init_distributed -> ... -> torch.distributed.init_process_group
      -> initialize_model_parallel -> torch.distributed.new_group  (x every group, same order)
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from cli_here import run_minitron
from megatron_reference import DESC, KINDS, coordinates, creation_sequence, reference_layout
from test_readme import excerpt_chunks, normalise

WORLD, TP, PP = 16, 2, 4


@pytest.fixture(scope="module")
def trace16(tmp_path_factory):
    """`minitron trace --tp 2 --pp 4 --world 16`, the README's main job, run once for every test
    of this file: most read its files, the last its output at the 100 columns the README's
    excerpt was taken at (one file, so that the suite's workers, which share out whole files,
    run it once). The command exactly as written: on a CPU machine it picks
    gloo, and asking the accelerator shows in the trace (validate_args calls get_accelerator
    only when --backend is not given). On a GPU machine it is told gloo: 16 NCCL ranks would
    need 16 GPUs. Returns the trace directory and the finished process."""
    cwd = tmp_path_factory.mktemp("trace16")
    env = {**os.environ, "COLUMNS": "100"}
    gloo = ["--backend", "gloo"] if torch.cuda.is_available() else []
    proc = run_minitron("trace", "--tp", "2", "--pp", "4", "--world", "16", *gloo, cwd=cwd, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return cwd / "minitron-trace", proc


@pytest.fixture(scope="module")
def run16(trace16):
    out, _ = trace16
    records = {}
    for r in range(WORLD):
        lines = (out / f"rank{r}.jsonl").read_text().splitlines()
        records[r] = {rec["id"]: rec for rec in map(json.loads, lines)}
    return out, records


def short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def ancestors(recs: dict, rec: dict) -> list[str]:
    """Names from ``rec`` up to the root, following parent ids."""
    chain = [short(rec["name"])]
    while rec["parent"] is not None:
        rec = recs[rec["parent"]]
        chain.append(short(rec["name"]))
    return chain


def is_subsequence(wanted: list[str], chain: list[str]) -> bool:
    it = iter(chain)
    return all(name in it for name in wanted)


def test_one_file_and_one_process_per_rank(run16):
    out, records = run16
    assert sorted(p.name for p in out.glob("rank*.jsonl")) == sorted(f"rank{r}.jsonl" for r in range(WORLD))
    pids = set()
    for r, recs in records.items():
        assert {rec["rank"] for rec in recs.values()} == {r}
        mine = {rec["pid"] for rec in recs.values()}
        assert len(mine) == 1
        pids |= mine
    assert len(pids) == WORLD and os.getpid() not in pids


def test_call_chain_on_every_rank(run16):
    _, records = run16
    for r, recs in records.items():
        inits = [x for x in recs.values() if x["name"] == "torch.distributed.init_process_group"]
        assert len(inits) == 1, r
        chain = ancestors(recs, inits[0])
        assert chain[-2:] == ["pretrain", "__main__"], (r, chain)  # the root: pretrain_gpt's entry
        assert is_subsequence(["init_process_group", "init_distributed", "_initialize_distributed",
                               "initialize_megatron", "pretrain"], chain), (r, chain)
        assert inits[0]["args"].get("rank") == r and inits[0]["args"].get("world_size") == WORLD

        imp = [x for x in recs.values() if short(x["name"]) == "initialize_model_parallel"]
        assert len(imp) == 1, r
        assert is_subsequence(["initialize_model_parallel", "_initialize_distributed",
                               "initialize_megatron", "pretrain"], ancestors(recs, imp[0])), r
        new_groups = [x for x in recs.values() if x["name"] == "torch.distributed.new_group"]
        assert new_groups and all(x["parent"] == imp[0]["id"] for x in new_groups), r


def new_group_calls(recs: dict) -> list[tuple[str, list[int]]]:
    calls = sorted((x for x in recs.values() if x["name"] == "torch.distributed.new_group"),
                   key=lambda x: x["id"])  # ids are handed out as calls begin
    return [(x["args"]["group_desc"], x["args"]["ranks"]) for x in calls]


def test_new_group_calls_are_identical_across_ranks_and_in_megatrons_order(run16):
    _, records = run16
    rank0 = new_group_calls(records[0])
    for r, recs in records.items():
        assert new_group_calls(recs) == rank0, f"rank {r} created different groups than rank 0"
        for x in recs.values():
            if x["name"] == "torch.distributed.new_group":
                assert x["args"]["member"] == (r in x["args"]["ranks"])
    assert rank0 == creation_sequence(WORLD, TP, PP)


def test_every_group_of_the_layout_was_created(run16):
    _, records = run16
    created = {(desc, tuple(ranks)) for desc, ranks in new_group_calls(records[0])}
    ref = reference_layout(WORLD, TP, PP)
    for kind in KINDS:
        for group in ref[kind]:
            assert (DESC[kind], tuple(group)) in created, (kind, group)
    # Megatron's docstring groups, by name.
    assert ("TENSOR_MODEL_PARALLEL_GROUP", (14, 15)) in created
    assert ("DATA_PARALLEL_GROUP", (5, 7)) in created
    assert ("PIPELINE_MODEL_PARALLEL_GROUP", (3, 7, 11, 15)) in created


def test_chrome_trace_has_one_named_row_per_rank(run16):
    out, records = run16
    doc = json.loads((out / "trace.json").read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    assert isinstance(events, list) and events
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert len(names) == WORLD
    expected = {}
    for r in range(WORLD):
        c = coordinates(r, WORLD, TP, PP)
        expected[r] = f"rank {r} (tp {c['tp']}, pp {c['pp']}, dp {c['dp']})"
    assert sorted(names.values()) == sorted(expected.values())
    assert expected[5] == "rank 5 (tp 1, pp 1, dp 0)"
    # Complete events carry what Perfetto needs, and every row has some.
    spans = [e for e in events if e.get("ph") == "X"]
    for e in spans:
        assert {"name", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0
    assert {e["pid"] for e in spans} == set(names)
    assert len(spans) == sum(len(recs) for recs in records.values())


# The README's excerpt of this run (what the newcomer's first command prints; test_readme.py
# keeps the README's other promises).
@pytest.mark.skipif(torch.cuda.is_available(), reason="the README's excerpt is the CPU machine's run (gloo)")
def test_readme_excerpt_is_what_the_main_job_prints(trace16):
    printed = normalise(trace16[1].stdout)  # the run the other tests read, at 100 columns
    chunks = excerpt_chunks()
    assert len(chunks) >= 2  # the tree's start, then the checks and the closing line
    stale = [chunk for chunk in chunks if normalise(chunk) not in printed]
    assert not stale, ("README's output excerpt no longer matches `minitron trace --tp 2 --pp 4 "
                       "--world 16` (regenerate it with scripts/readme_excerpt.py --write):\n"
                       + "\n---\n".join(stale))
