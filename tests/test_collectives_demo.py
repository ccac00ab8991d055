"""Chapter 0's collectives, run once on 4 gloo ranks: each result is the arithmetic it claims.

docs/examples/collectives_demo.py gives rank r the numbers 10r+1 .. 10r+4 and runs six calls;
each check below computes the answer without torch.distributed and compares. The bytes are
the ring rule's, from the traced shapes; the picture carries the run's values.
"""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from minitron.cli.views import svg
from minitron.cli.views.svg_collectives import collectives_svg

ROOT = Path(__file__).resolve().parent.parent
NS = "{http://www.w3.org/2000/svg}"


def _demo():
    spec = importlib.util.spec_from_file_location("collectives_demo", ROOT / "docs/examples/collectives_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = _demo()
P, SIZE = demo.WORLD, demo.SIZE
START = [demo.start_values(r) for r in range(P)]
TOTAL = [sum(START[r][k] for r in range(P)) for k in range(SIZE)]
BYTES = SIZE * 4   # float32
BLOCK = SIZE // P


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    kept = demo.run(str(tmp_path_factory.mktemp("coll")))
    return {c["name"]: c["ranks"] for c in kept["collectives"]} | {"_all": kept}


def test_every_rank_starts_from_its_own_numbers(kept):
    for name in ("broadcast", "all-reduce", "reduce-scatter", "all-to-all", "send/recv"):
        assert [r["before"] for r in kept[name]] == START, name


def test_broadcast_copies_rank_0(kept):
    assert all(r["after"] == START[0] for r in kept["broadcast"])


def test_all_reduce_is_the_sum_everywhere(kept):
    assert all(r["after"] == TOTAL for r in kept["all-reduce"])


def test_reduce_scatter_leaves_block_r_of_the_sum_and_all_gather_restores_it(kept):
    for r, held in enumerate(kept["reduce-scatter"]):
        assert held["after"] == TOTAL[r * BLOCK:(r + 1) * BLOCK]
    for r, held in enumerate(kept["all-gather"]):
        assert held["before"] == kept["reduce-scatter"][r]["after"]
        assert held["after"] == TOTAL == kept["all-reduce"][r]["after"]


def test_all_to_all_is_a_transpose(kept):
    for r, held in enumerate(kept["all-to-all"]):
        assert held["after"] == [START[j][r * BLOCK + i] for j in range(P) for i in range(BLOCK)]


def test_send_recv_passes_each_stage_its_predecessors_tensor(kept):
    for r, held in enumerate(kept["send/recv"]):
        assert held["after"] == (START[r - 1] if r else START[0])


def test_bytes_follow_the_ring_rule(kept):
    ring = {"all-reduce": 2 * (P - 1) * BYTES // P, "reduce-scatter": (P - 1) * BYTES // P,
            "all-gather": (P - 1) * BYTES // P, "all-to-all": (P - 1) * BYTES // P}
    for name, each in ring.items():
        assert all(r["sent"] == r["received"] == each for r in kept[name]), name
    assert kept["all-reduce"][0]["sent"] == kept["reduce-scatter"][0]["sent"] + kept["all-gather"][0]["sent"]
    # a chain from rank 0, and a pipeline 0 -> 1 -> 2 -> 3: the ends send or receive nothing
    for name in ("broadcast", "send/recv"):
        assert [(r["sent"], r["received"]) for r in kept[name]] == \
            [(BYTES, 0)] + [(BYTES, BYTES)] * (P - 2) + [(0, BYTES)], name


def test_bytes_come_from_the_traced_calls(kept):
    assert kept["all-reduce"][0]["calls"] == [f"all_reduce([{SIZE}] float32)"]
    assert kept["all-gather"][0]["calls"] == [f"all_gather_into_tensor([{BLOCK}] float32)"]
    assert sorted(kept["send/recv"][1]["calls"]) == [f"recv([{SIZE}] float32)", f"send([{SIZE}] float32)"]


def test_the_picture_shows_every_value_of_the_run(kept):
    root = ET.fromstring(collectives_svg(kept["_all"]))
    blocks = {g.get("data-collective"): g for g in root.iter(f"{NS}g") if g.get("data-collective")}
    assert list(blocks) == list(demo.CALLS)
    for name, block in blocks.items():
        shown = [float(g.get("data-value")) for g in block.iter(f"{NS}g") if g.get("data-value")]
        expected = [v for r in kept[name] for v in r["before"] + r["after"]]
        assert shown == expected, name
    width = float(root.get("viewBox").split()[2])
    for text in root.iter(f"{NS}text"):   # every label inside the picture, at svg.CHAR_W a character
        w = svg.text_width(text.text or "", float(text.get("font-size")))
        left = float(text.get("x")) - {"start": 0, "middle": w / 2, "end": w}[text.get("text-anchor")]
        assert 0 <= left and left + w <= width, f"{text.text!r} leaves the picture"


def test_cost_table_is_the_rule(capsys):
    demo.cost(100)
    rows = {int(line.split()[0]): line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    for p, row in rows.items():
        assert float(row[4]) == pytest.approx(round(2 * (p - 1) / p * 100, 1))
        assert float(row[6]) == pytest.approx((p - 1) * 100)
