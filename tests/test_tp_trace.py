"""The trace of a Column -> Row pair shows each TP collective under the step that issued it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import minitron.core.models.gpt  # noqa: F401  (the script imports it inside the ranks; load it once here)
from distributed import run_ranks

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "tp_pair_trace.py"
_spec = importlib.util.spec_from_file_location("tp_pair_trace", SCRIPT)
tp_pair_trace = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tp_pair_trace)

TP_GROUP = "TENSOR_MODEL_PARALLEL_GROUP"


def _ancestors(record: dict, by_id: dict) -> list[str]:
    names = []
    while record["parent"] is not None:
        record = by_id[record["parent"]]
        names.append(record["name"])
    return names


def _collectives(trace_dir: Path, rank: int):
    records = tp_pair_trace.load_records(trace_dir, rank)
    by_id = {r["id"]: r for r in records}
    step = next(r for r in records if r["name"] == tp_pair_trace.STEP)
    inside = [r for r in records if r["name"].startswith("torch.distributed.")
              and step["name"] in _ancestors(r, by_id)]
    return inside, by_id


def _run(tmp_path: Path, sequence_parallel: bool) -> Path:
    trace_dir = tmp_path / "trace"
    run_ranks(lambda rank: tp_pair_trace.pair_step(4, 2, 8, sequence_parallel), world_size=2, tp=2,
              trace_dir=str(trace_dir))
    return trace_dir


LINEAR_BACKWARD = "minitron.core.tensor_parallel.layers.LinearWithGradAccumulationAndAsyncCommunication.backward"


def test_pair_has_one_all_reduce_forward_under_row_and_one_backward_in_the_column_linear(tmp_path):
    trace_dir = _run(tmp_path, sequence_parallel=False)
    for rank in (0, 1):
        collectives, by_id = _collectives(trace_dir, rank)
        assert [c["name"] for c in collectives] == ["torch.distributed.all_reduce"] * 2
        forward, backward = collectives
        assert "minitron.core.tensor_parallel.layers.RowParallelLinear.forward" in _ancestors(forward, by_id)
        assert "tp_pair.forward" in _ancestors(forward, by_id)
        # f's all-reduce, issued by the column linear's own backward (allreduce_dgrad), async
        assert by_id[backward["parent"]]["name"] == LINEAR_BACKWARD
        assert backward["args"].get("async_op") is True and "async_op" not in forward["args"]
        assert "tp_pair.backward" in _ancestors(backward, by_id)
        for c in collectives:
            assert c["args"]["group"] == TP_GROUP and c["args"]["ranks"] == [0, 1]
            assert c["args"]["shape"] == [4, 2, 8]        # [s, b, h]: Row's output, Column's input grad


def test_sequence_parallel_pair_gathers_and_reduce_scatters_instead(tmp_path):
    trace_dir = _run(tmp_path, sequence_parallel=True)
    collectives, by_id = _collectives(trace_dir, 0)
    names = [c["name"].removeprefix("torch.distributed.") for c in collectives]
    assert names == ["all_gather_into_tensor", "reduce_scatter_tensor",     # forward: Column, Row
                     "all_gather_into_tensor",                              # backward: Row,
                     "all_gather_into_tensor", "reduce_scatter_tensor"]     # Column: re-gather, dgrad
    assert all(c["args"]["group"] == TP_GROUP and c["args"]["ranks"] == [0, 1] for c in collectives)
    assert "minitron.core.tensor_parallel.layers.ColumnParallelLinear.forward" in _ancestors(collectives[0], by_id)
    assert collectives[0]["args"]["shape"] == [2, 2, 8]   # my half of the sequence goes in
    assert collectives[1]["args"]["shape"] == [4, 2, 8]   # the whole sequence's partial sums
    regather, dgrad = collectives[3:]                     # the column linear's backward, both async
    assert by_id[regather["parent"]]["name"] == by_id[dgrad["parent"]]["name"] == LINEAR_BACKWARD
    assert regather["args"]["shape"] == [2, 2, 8] and dgrad["args"]["shape"] == [4, 2, 8]
    assert regather["args"]["async_op"] is True and dgrad["args"]["async_op"] is True


def test_rendered_tree_names_layers_groups_and_shapes(tmp_path):
    trace_dir = _run(tmp_path, sequence_parallel=False)
    text = tp_pair_trace.render_tree(tp_pair_trace.load_records(trace_dir, 0))
    assert "RowParallelLinear.forward" in text and "LinearWithGradAccumulationAndAsyncCommunication.backward" in text
    assert text.count(f"all_reduce  {TP_GROUP} [0, 1]  shape [4, 2, 8]") == 2
    assert text.count("float32  async") == 1              # only the backward one returns at once


def test_every_collective_of_a_gpt_step_sits_under_the_step_that_issued_it(tmp_path):
    trace_dir = tmp_path / "trace"
    run_ranks(lambda rank: tp_pair_trace.gpt_step(4, 2, 8), world_size=2, tp=2, trace_dir=str(trace_dir))
    records = tp_pair_trace.load_records(trace_dir, 0)
    by_id = {r["id"]: r for r in records}
    step = next(r for r in records if r["name"] == tp_pair_trace.GPT_STEP)
    collectives = [r for r in records if r["name"].startswith("torch.distributed.")
                   and step["name"] in _ancestors(r, by_id)]
    issuers = [by_id[c["parent"]]["name"].split("mappings.")[-1].split("layers.")[-1].split(".")[-1]
               if "backward" not in by_id[c["parent"]]["name"]
               else ".".join(by_id[c["parent"]]["name"].split(".")[-2:]) for c in collectives]
    assert all(c["args"]["group"] == TP_GROUP for c in collectives)
    # forward: embedding, attention projection, MLP fc2 (g each), the loss's max / target / sum;
    # backward: the three column-parallel linears' input gradients (f each, inside the linear):
    # output layer, fc1, qkv.
    assert issuers == (["reduce_from_tensor_model_parallel_region"] * 3 + ["vocab_parallel_cross_entropy"] * 3
                       + ["LinearWithGradAccumulationAndAsyncCommunication.backward"] * 3)
    embedding = collectives[0]
    assert "minitron.core.tensor_parallel.layers.VocabParallelEmbedding.forward" in _ancestors(embedding, by_id)
