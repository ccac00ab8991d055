"""`minitron estimate --cluster`: the time model (training/theoretical_time.py) against hand
arithmetic, the link chosen per group, cluster files, --compare's ranking, and the one-GPU
compute time held against minitron's recorded H100 run."""

from __future__ import annotations

import json
import math

import pytest

from cli_here import run_minitron
from minitron.cli.common import validate_pretrain
from minitron.training.clusters import BUILT_IN, ClusterError, cluster_from, load_cluster
from minitron.training.theoretical_memory_usage import report_theoretical_memory
from minitron.training.theoretical_time import (
    RECORDED_RUN, group_times, iteration_time, link_of, recorded_mfu, ring_seconds, tree_seconds,
)
from minitron.training.tokenizer import build_tokenizer

H100 = BUILT_IN["h100"]
SMALL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "64",
         "--micro-batch-size", "1", "--global-batch-size", "16", "--vocab-size", "1023", "--bf16"]


def _args(argv, world):
    args = validate_pretrain(argv, world)
    build_tokenizer(args)
    return args


def test_formulas_by_hand_two_nodes():
    """A 1 GB all-reduce, 10 calls: inside a node (8 on NVLink), and over both nodes (16, IB)."""
    nvlink, ib = link_of(H100, list(range(8))), link_of(H100, list(range(16)))
    assert (nvlink.name, ib.name) == ("nvlink", "ib")
    n = 1e9
    # ring: 2(p-1)/p · N/B + 2(p-1)·α per call
    assert ring_seconds("all-reduce", n, 10, 8, nvlink) == pytest.approx(2 * 7 / 8 * n / 450e9 + 10 * 14 * 1e-6)
    assert ring_seconds("all-reduce", n, 10, 16, ib) == pytest.approx(2 * 15 / 16 * n / 50e9 + 10 * 30 * 5e-6)
    # tree: 2 · N/B + 2·⌈log2 p⌉·α per call
    assert tree_seconds("all-reduce", n, 10, 16, ib) == pytest.approx(2 * n / 50e9 + 10 * 2 * 4 * 5e-6)
    assert tree_seconds("send", n, 10, 16, ib) is None
    # all-to-all: (p-1)/p · N/B + (p-1)·α; send: N/B + α
    assert ring_seconds("all-to-all", n, 1, 16, ib) == pytest.approx(15 / 16 * n / 50e9 + 15 * 5e-6)
    assert ring_seconds("send", n, 4, 2, ib) == pytest.approx(n / 50e9 + 4 * 5e-6)
    # one call of a small message: the tree's fewer hops win; a big bucket: the ring's fewer bytes
    assert tree_seconds("all-reduce", 8, 1, 16, ib) < ring_seconds("all-reduce", 8, 1, 16, ib)
    assert ring_seconds("all-reduce", n, 1, 16, ib) < tree_seconds("all-reduce", n, 1, 16, ib)


def test_group_inside_a_node_uses_nvlink_across_uses_ib():
    """16 ranks on two 8-GPU nodes at tp 8: tp stays in a node, dp crosses, tp 16 crosses too."""
    args = _args(SMALL + ["--tensor-model-parallel-size", "8"], 16)
    links = {g.key: (g.link, g.size) for g in group_times(args, report_theoretical_memory(args)[0], H100)}
    assert links["tp"] == ("nvlink", 8) and links["dp-cp"] == ("ib", 2)
    args = _args(SMALL + ["--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "4"], 16)
    links = {g.key: (g.link, g.size) for g in group_times(args, report_theoretical_memory(args)[0], H100)}
    assert links["tp"] == ("nvlink", 4) and links["pp"] == ("ib", 4)   # ranks 0, 4, 8, 12


def test_bubble_and_sum():
    args = _args(SMALL + ["--pipeline-model-parallel-size", "4"], 8)   # dp 2, m 8
    t = iteration_time(args, report_theoretical_memory(args), H100, 0.5)
    assert t["bubble_s"] == pytest.approx(t["compute_s"] * 3 / 8)
    assert t["bubble_fraction"] == pytest.approx(3 / (8 + 3) * (t["compute_s"] + t["bubble_s"]) / t["iteration_s"])
    assert t["iteration_s"] == pytest.approx(t["compute_s"] + t["bubble_s"] + t["comm_s"])
    args = _args(SMALL + ["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2"], 8)   # v 2: (p-1)/(v·m)
    t = iteration_time(args, report_theoretical_memory(args), H100, 0.5)
    assert t["bubble_s"] == pytest.approx(t["compute_s"] * 1 / (2 * 4))


def test_recorded_h100_run_reproduced():
    """One H100, the bench model, compute only: by construction the time is the recorded one,
    since the MFU was derived from it; what the test checks is that the FLOP count is the same
    count the bench divided by (and so the MFU means the same thing here)."""
    run = json.loads(RECORDED_RUN.read_text())
    m = run["model"]
    args = _args(["--num-layers", str(m["num_layers"]), "--hidden-size", str(m["hidden_size"]),
                  "--num-attention-heads", str(m["num_attention_heads"]), "--seq-length", str(m["seq_length"]),
                  "--micro-batch-size", str(m["micro_batch_size"]), "--global-batch-size",
                  str(m["global_batch_size"]), "--vocab-size", str(m["vocab_size"]), "--bf16"], 1)
    assert args.padded_vocab_size == m["padded_vocab"]
    mfu, source = recorded_mfu()
    assert "H100" in source
    t = iteration_time(args, report_theoretical_memory(args), H100, mfu)
    assert t["flops_per_iteration"] == run["flops_per_iteration"]
    assert t["comm_s"] == 0 and t["bubble_s"] == 0
    assert t["iteration_s"] * 1e3 == pytest.approx(run["results"]["minitron"]["ms_per_iteration"], rel=0.01)


def test_cluster_descriptions(tmp_path):
    keys = H100.as_json() | {"name": "mine", "gpus_per_node": 4}
    (tmp_path / "c.json").write_text(json.dumps(keys))
    assert load_cluster(str(tmp_path / "c.json")).gpus_per_node == 4
    (tmp_path / "c.toml").write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in keys.items()))
    assert load_cluster(str(tmp_path / "c.toml")) == load_cluster(str(tmp_path / "c.json"))
    for bad, words in [({**keys, "ib_gb_s": 0}, "ib_gb_s 0"), ({**keys, "gpus_per_node": 2.5}, "whole number"),
                       ({**keys, "nvlink": 1}, "unknown key 'nvlink'"), ({"name": "x"}, "missing gpus_per_node"),
                       ({**keys, "peak_tflops": math.inf}, "above 0"), ({**keys, "peak_tflops": True}, "above 0")]:
        with pytest.raises(ClusterError, match=words):
            cluster_from(bad, "--cluster f")


def test_cli_cluster_file_and_refusals(tmp_path):
    world = ["estimate", "--world", "16", *SMALL, "--tp", "8"]
    good = tmp_path / "four.json"
    good.write_text(json.dumps(H100.as_json() | {"name": "four", "gpus_per_node": 4}))
    proc = run_minitron(*world, "--cluster", good, "--json", here=True)
    assert proc.returncode == 0, proc.stderr
    time = json.loads(proc.stdout)["time"]
    assert time["cluster"] == "four" and {g["key"]: g["link"] for g in time["groups"]}["tp"] == "ib"
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus_per_node": 8,')
    for extra, words in [(["--cluster", bad], "cannot read it as JSON"), (["--cluster", "h300"], "not a built-in"),
                         (["--mfu", "0.4"], "add --cluster"), (["--cluster", "h100", "--mfu", "2"], "at most 1"),
                         (["--cluster", "h100", "--compare", "tp=3"], "--compare 'tp=3'")]:
        proc = run_minitron(*world, *extra, here=True)
        assert proc.returncode == 2 and words in proc.stderr, (extra, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_compare_ranks_a_node_bound_tp_first():
    """tp 8 stays inside an 8-GPU node, tp 16 sends every layer's all-reduces over InfiniBand."""
    proc = run_minitron("estimate", "--world", "32", *SMALL, "--num-attention-heads", "16", "--cluster", "h100",
                        "--compare", "tp=16", "--compare", "tp=8", "--json", here=True)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["layouts"]
    assert [r["layout"] for r in rows] == ["tp=8", "tp=16"]
    assert rows[0]["iteration_s"] < rows[1]["iteration_s"]
    text = run_minitron("estimate", "--world", "32", *SMALL, "--num-attention-heads", "16", "--cluster", "h100",
                        "--compare", "tp=16", "--compare", "tp=8", here=True).stdout
    assert "fastest first" in text and "not modelled" in text
