"""DeepSpeed's comms logger (minitron/utils/comms_logging.py, the hook in minitron/comm/comm.py):
the ds_config's comms_logger section turns it on as DeepSpeed 0.19.8 does (the section's presence,
not its ``enabled`` key), every collective the engine makes through minitron.comm is logged with
its op name and message size, and log_summary prints DeepSpeed's table.

Two forked gloo ranks train TiedNet two steps at ZeRO stage 2 (broadcasts, reduce-scatters or
all-reduces and all-gathers) while the call trace records the same calls; the logger's op names and
sizes per count must equal the trace's. The bandwidth formulas are held against hand-worked cases.
test_ds_comms_logger_peer.py holds the formulas and the table against DeepSpeed's own code.
"""

import contextlib
import io
import math
from collections import Counter

import pytest
import torch

from distributed import run_ranks
from minitron.runtime.config import DeepSpeedConfig
from minitron.runtime.config_values import DeepSpeedConfigError
from minitron.trace.reader import load_trace
from minitron.utils.comms_logging import COLUMNS, calc_bw_log, convert_size, trim_mean
from test_ds_checkpoint import TiedNet, train

WORLD = 2
COLLECTIVES = ("broadcast", "all_reduce", "reduce", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
               "all_to_all_single", "barrier", "send", "recv")
BASE = {"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}


def _runs(rank: int) -> dict:
    from minitron import comm as dist
    from minitron.runtime import initialize
    from minitron.utils.comms_logging import comms_logger
    out = {}
    engine, *_ = initialize(model=TiedNet(), config={**BASE, "comms_logger": {"enabled": False}})
    train(engine, rank, "fp32", range(2))
    out["logged"] = {name: {size: vals[0] for size, vals in sizes.items()}
                     for name, sizes in comms_logger.comms_dict.items()}
    out["latencies"] = {name: vals[1] for name, sizes in comms_logger.comms_dict.items()
                        for vals in sizes.values()}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        out["summary"] = dist.log_summary()
    out["printed"] = printed.getvalue().splitlines()
    # prof_all off: only the listed ops; debug: the caller's name in the log name
    comms_logger.comms_dict.clear()
    engine, *_ = initialize(model=TiedNet(), config={**BASE, "comms_logger": {
        "prof_all": False, "prof_ops": ["broadcast"], "debug": True}})
    out["listed"] = sorted(comms_logger.comms_dict)
    comms_logger.comms_dict.clear()
    engine, *_ = initialize(model=TiedNet(), config=BASE)   # no section: nothing timed
    train(engine, rank, "fp32", range(1))
    out["without"] = dict(comms_logger.comms_dict)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    where = tmp_path_factory.mktemp("comms_logger")
    return run_ranks(_runs, world_size=WORLD, tp=None, trace_dir=str(where)), load_trace(where)


def _traced_ops(records: list) -> Counter:
    """The first engine's minitron.comm collectives (until the first log_summary's barrier), each
    with the bytes of its input as the torch.distributed call inside it recorded them."""
    ops, calls = Counter(), sorted(records, key=lambda r: r["start_us"])
    inside = {r["parent"]: r for r in calls if r["name"].startswith("torch.distributed.")}
    for record in calls:
        op = record["name"].rsplit(".", 1)[1]
        if not record["name"].startswith("minitron.comm.comm.") or op not in COLLECTIVES:
            continue
        if op == "barrier":
            break
        args = inside[record["id"]]["args"]   # torch's call, made inside ours
        itemsize = torch.empty(0, dtype=getattr(torch, args["dtype"])).element_size()
        shape = args.get("input_shape") or args["shape"]
        if op == "all_gather":   # the outputs' shapes, one per rank, each the input's
            shape = shape[0]
        ops[op, math.prod(shape) * itemsize] += 1
    return ops


def test_logged_ops_and_sizes_equal_the_trace(runs):
    results, records = runs
    for rank, out in enumerate(results):
        logged = Counter({(name, size): n for name, sizes in out["logged"].items() for size, n in sizes.items()})
        assert logged == _traced_ops(records[rank]) and len(logged) >= 3


def test_latency_is_deepspeeds_running_sum(runs):
    # DeepSpeed's never-reset timer: each op's recorded latency is the sum so far, so it never falls
    for out in runs[0]:
        for latencies in out["latencies"].values():
            assert latencies == sorted(latencies)


def test_log_summary_prints_deepspeeds_table(runs):
    rank0, rank1 = runs[0]
    assert rank1["printed"] == []   # rank 0 prints
    header, *rows = rank0["printed"]
    assert [header[i:i + 20].rstrip() for i in range(0, 140, 20)] == list(COLUMNS)
    names = [row for row in rows if not row.startswith(" ")]
    assert names == list(rank0["summary"]) and "log_summary_barrier" in names   # its first barrier is logged
    for name in names:
        sizes = rank0["summary"][name]
        lines = rows[rows.index(name) + 1:rows.index(name) + 1 + len(sizes)]
        for line, (size, row) in zip(lines, sizes.items()):
            cells = [line[i:i + 20].strip() for i in range(20, 140, 20)]
            assert cells[:2] == [convert_size(size), str(row["count"])]
            assert [float(c) for c in cells[2:]] == pytest.approx(
                [row[k] for k in ("total_latency_ms", "avg_latency_ms", "tput_avg_gbps", "busbw_avg_gbps")],
                abs=0.005)   # printed to 2 decimals


def test_prof_ops_debug_and_no_section(runs):
    for out in runs[0]:
        assert out["listed"] == ["broadcast | [Caller Func: _broadcast_model]"]
        assert out["without"] == {}


def test_bandwidths_by_hand():
    # 1e6 bytes in 2 ms on 4 ranks is 0.5e6 bytes/ms = 4 Gbps (x8 bits / 1e6)
    assert calc_bw_log("all_reduce", 1e6, 2.0, 4) == pytest.approx((8.0, 6.0))     # 2x; 2(n-1)/n
    assert calc_bw_log("all_gather", 1e6, 2.0, 4) == pytest.approx((16.0, 12.0))   # n inputs; (n-1)/n
    assert calc_bw_log("reduce_scatter_tensor", 1e6, 2.0, 4) == pytest.approx((16.0, 12.0))
    assert calc_bw_log("all_to_all_single", 1e6, 2.0, 4) == pytest.approx((4.0, 3.0))
    assert calc_bw_log("broadcast", 1e6, 2.0, 4) == pytest.approx((4.0, 4.0))
    with pytest.raises(ValueError, match="no bandwidth formula for 'gossip'"):
        calc_bw_log("gossip", 1, 1.0, 2)


def test_sizes_and_trimmed_mean():
    assert [convert_size(b) for b in (0, 1, 1536, 1 << 20, 3 * (1 << 30) // 2)] == \
        ["0B", "1.0 B", "1.5 KB", "1.0 MB", "1.5 GB"]
    assert trim_mean([100.0] + [1.0] * 8 + [0.0], 0.1) == 1.0   # one of ten trimmed at each end
    assert trim_mean([], 0.1) == 0


@pytest.mark.parametrize("section, words", [
    ({"prof_ops": "all_reduce"}, "must be a list of operation names"),
    ({"verbose": "loud"}, "comms_logger.verbose must be true or false"),
    ({"enable": True}, "enable"),
])
def test_refused_in_one_line(section, words):
    with pytest.raises(DeepSpeedConfigError) as refused:
        DeepSpeedConfig({**BASE, "comms_logger": section}, world_size=2)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_section_turns_it_on_as_deepspeed():
    assert DeepSpeedConfig({**BASE, "comms_logger": {"enabled": False}}, world_size=2).comms_config["enabled"]
    assert not DeepSpeedConfig(BASE, world_size=2).comms_config["enabled"]
