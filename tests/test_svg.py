"""The SVG pictures: well-formed, and drawn from the data they claim to show.

One small traced run (4 gloo ranks, pp 2 x dp 2, one training iteration) feeds the grid and
timeline checks; the grid is also checked against the computed layout of a few layouts, and
the curves and shapes against records written here.
"""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from minitron.cli.views import svg
from minitron.cli.views.schedule import BACKWARD, FORWARD, pipeline_steps
from minitron.cli.views.svg_curves import bars_svg, curves_svg
from minitron.cli.views.svg_grid import grid_svg, groups_from_trace, shown_kinds
from minitron.cli.views.svg_timeline import peak_in_flight, place, timeline_svg
from minitron.trace.reader import load_trace
from minitron.core.group_layout import layout

NS = "{http://www.w3.org/2000/svg}"
ROOT = Path(__file__).resolve().parent.parent


def parse(text: str) -> ET.Element:
    root = ET.fromstring(text)  # raises on anything that is not well-formed XML
    assert root.tag == f"{NS}svg" and root.get("viewBox")
    assert_inside(root)
    return root


def assert_inside(root: ET.Element) -> None:
    """Every text fits the viewBox, at svg.CHAR_W per character: a label past the edge is
    clipped on the page (chapter 9's footer once stood at x = 725 in a 650-wide picture)."""
    width = float(root.get("viewBox").split()[2])
    for text in root.iter(f"{NS}text"):
        x, w = float(text.get("x")), svg.text_width(text.text or "", float(text.get("font-size")))
        left = {"start": x, "middle": x - w / 2, "end": x - w}[text.get("text-anchor", "start")]
        assert -0.5 <= left and left + w <= width + 0.5, f"{text.text!r} spans {left:.0f}..{left + w:.0f} of {width:.0f}"


def cells(root: ET.Element) -> dict[str, dict[int, tuple[str, str]]]:
    """kind -> rank -> (group index, fill colour) of each drawn cell."""
    out = {}
    for panel in root.iter(f"{NS}g"):
        kind = panel.get("data-kind")
        if kind is None:
            continue
        out[kind] = {}
        for cell in panel.iter(f"{NS}g"):
            if cell.get("data-rank") is not None:
                rank = int(cell.get("data-rank"))
                assert rank not in out[kind], f"rank {rank} drawn twice in the {kind} panel"
                out[kind][rank] = (cell.get("data-group"), cell.find(f"{NS}rect").get("fill"))
    return out


def assert_grid_matches(root: ET.Element, groups: dict, world: int) -> None:
    drawn = cells(root)
    assert list(drawn) == shown_kinds(groups)
    for kind, by_rank in drawn.items():
        assert sorted(by_rank) == list(range(world)), f"{kind}: not one cell per rank"
        member = {r: i for i, g in enumerate(groups[kind]) for r in g}
        for rank, (index, fill) in by_rank.items():
            if rank in member:
                assert index == str(member[rank]) and fill == svg.colour(member[rank])
            else:
                assert index == "none" and fill == "none"
        # same colour <=> same group (fewer than 30 groups: no colour repeats)
        for a in by_rank:
            for b in by_rank:
                if a in member and b in member:
                    assert (by_rank[a][1] == by_rank[b][1]) == (member[a] == member[b]), (kind, a, b)


@pytest.mark.parametrize("world,tp,pp,cp,ep,order", [
    (16, 2, 4, 1, 1, "tp-cp-ep-dp-pp"), (16, 2, 4, 1, 1, "tp-cp-ep-pp-dp"),
    (8, 2, 2, 2, 1, "tp-cp-ep-dp-pp"), (8, 2, 1, 1, 4, "tp-cp-ep-dp-pp")])
def test_grid_has_a_cell_per_rank_per_kind_coloured_by_group(world, tp, pp, cp, ep, order):
    groups = layout(world, tp, pp, cp, ep, order)
    root = parse(grid_svg(groups))
    assert_grid_matches(root, groups, world)
    if cp > 1:
        assert "cp" in cells(root)
    if ep > 1:
        assert "ep" in cells(root)
    # the model-parallel group (tp-pp), which chapter 6 discusses, has its panel when it is
    # more than the tp or the pp group alone
    assert ("tp-pp" in cells(root)) == (tp > 1 and pp > 1)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """A real run: 4 ranks, pp 2 x dp 2, one iteration, traced, with --svg (in this process,
    as `minitron trace` runs: the ranks are forked from it)."""
    from minitron.cli import app

    out = tmp_path_factory.mktemp("trace")
    code = app(["trace", "--world", "4", "--pp", "2", "--steps", "1", "--show", "checks", "--svg", "--out", str(out)],
               standalone_mode=False)
    assert code in (None, 0)
    assert (out / "groups.svg").is_file() and (out / "schedule.svg").is_file()
    return out, load_trace(out)


def test_trace_svg_grid_is_the_executed_groups(traced):
    out, runs = traced
    groups = groups_from_trace(runs[0])
    assert groups["tp"] == layout(4, 1, 2, 1, 1)["tp"] and groups["pp"] == layout(4, 1, 2, 1, 1)["pp"]
    assert_grid_matches(parse((out / "groups.svg").read_text()), groups, 4)


def test_timeline_has_one_box_per_traced_step_with_its_duration(traced):
    out, runs = traced
    stages = pipeline_steps(runs, iteration=0)
    root = parse((out / "schedule.svg").read_text())
    boxes = [g for g in root.iter(f"{NS}g") if g.get("data-step")]
    steps = [s for ss in stages.values() for s in ss]
    assert len(boxes) == len(steps) == 2 * 2 * 4   # 2 stages x 4 micro-batches x (F, B)
    traced_steps = sorted((("F" if s["name"] == FORWARD else "B"), s["args"]["microbatch"],
                           round(s["end_us"] - s["start_us"])) for s in steps)
    drawn = sorted((b.get("data-step"), int(b.get("data-microbatch")), round(float(b.get("data-us")))) for b in boxes)
    assert drawn == traced_steps
    # each box's width is its duration on the picture's one scale
    widths = {(b.get("data-step"), b.get("data-microbatch"), b.get("data-us")): float(b.find(f"{NS}rect").get("width"))
              for b in boxes}
    scale = {w / float(us) for (_, _, us), w in widths.items() if float(us) > 200 and w > 2}
    assert max(scale) / min(scale) < 1.05


def test_replay_respects_dependencies_and_peak_in_flight(traced):
    _, runs = traced
    stages = pipeline_steps(runs, iteration=0)
    placed = place(stages)
    end = {(st, s["name"], s["args"]["microbatch"]): e for st, row in placed.items() for _, e, s in row}
    for st, row in placed.items():
        for (start, _, step), (_, prev_end, _) in zip(row[1:], row):
            assert start >= prev_end - 1e-6                       # one step at a time per stage
        for start, _, step in row:
            mb = step["args"]["microbatch"]
            if step["name"] == FORWARD and st > 0:
                assert start >= end[(st - 1, FORWARD, mb)] - 1e-6  # waits for the activation
            if step["name"] == BACKWARD and st < 1:
                assert start >= end[(st + 1, BACKWARD, mb)] - 1e-6  # waits for the gradient
    # 1F1B: stage r holds at most pp - r micro-batches
    assert [peak_in_flight(stages[s]) for s in (0, 1)] == [2, 1]
    fake = [{"name": FORWARD, "start_us": i, "args": {}} for i in range(4)] + \
           [{"name": BACKWARD, "start_us": 10 + i, "args": {}} for i in range(4)]
    assert peak_in_flight(fake) == 4                          # all forwards, then all backwards


def test_unit_times_give_the_textbook_bubble(traced):
    """In unit mode (forward 1, backward 2) every 1F1B stage idles (p - 1) / (m + p - 1) of the
    iteration, whatever the machine was doing: chapter 11 draws its comparison this way."""
    _, runs = traced
    placed = place(pipeline_steps(runs, iteration=0), "unit")
    p, m = 2, 4
    length = max(end for row in placed.values() for _, end, _ in row)
    for row in placed.values():
        busy = sum(end - start for start, end, _ in row)
        assert abs((1 - busy / length) - (p - 1) / (m + p - 1)) < 1e-9
    root = parse(timeline_svg([("1F1B", pipeline_steps(runs, iteration=0))], "unit"))
    assert any("not measured" in (t.text or "") for t in root.iter(f"{NS}text"))


def test_timelines_share_one_scale_and_wall_mode(traced):
    _, runs = traced
    stages = pipeline_steps(runs, iteration=0)
    both = parse(timeline_svg([("a", stages), ("b", stages)]))
    assert len([g for g in both.iter(f"{NS}g") if g.get("data-step")]) == 2 * 16
    wall = place(stages, "wall")
    assert min(s for row in wall.values() for s, _, _ in row) == 0
    with pytest.raises(ValueError):
        place(stages, "later")


def test_curves_and_bars_carry_their_values():
    xs = [1, 2, 3, 4]
    root = parse(curves_svg(xs, {"lm_loss": [7.0, 6.5, 6.4, 6.0], "lr": [1e-3, 2e-3, 1.5e-3, 1e-4]}))
    points = {s.get("data-series"): [(float(c.get("data-x")), float(c.get("data-y"))) for c in s.iter(f"{NS}circle")]
              for s in root.iter(f"{NS}g") if s.get("data-series")}
    assert points["lm_loss"] == [(1, 7.0), (2, 6.5), (3, 6.4), (4, 6.0)] and len(points["lr"]) == 4
    # readable ticks: one power of ten for the panel, said in its title; one number of decimals
    ticks = {s.get("data-series"): [t.text for t in s.iter(f"{NS}text") if t.get("data-tick")]
             for s in root.iter(f"{NS}g") if s.get("data-series")}
    assert ticks["lr"] == ["0", "1", "2"] and ticks["lm_loss"] == ["6.0", "6.5", "7.0"]
    titles = [t.text for t in root.iter(f"{NS}text") if t.get("font-weight") == "bold"]
    assert "learning rate × 1e-3" in titles
    root = parse(bars_svg({"rank 0": {"parameters": 100, "Adam moments": 400}, "rank 1": {"parameters": 50}}))
    values = {(row.get("data-row"), part.get("data-part")): float(part.get("data-value"))
              for row in root.iter(f"{NS}g") if row.get("data-row") for part in row.iter(f"{NS}g") if part.get("data-part")}
    assert values == {("rank 0", "parameters"): 100, ("rank 0", "Adam moments"): 400,
                      ("rank 1", "parameters"): 50, ("rank 1", "Adam moments"): 0}


def test_text_is_escaped():
    root = parse(svg.document(120, 16, [svg.text(0, 0, "a < b & c > d")], 'say "hi" & <bye>'))
    assert root.find(f"{NS}text").text == "a < b & c > d"


def test_shapes_are_the_traced_ones(tmp_path):
    """scripts/tp_pair_trace.py on 2 ranks with sequence parallelism, drawn by svg_shapes."""
    from minitron.cli.views.svg_shapes import pair_steps, shapes_svg

    spec = importlib.util.spec_from_file_location("tp_pair_trace", ROOT / "scripts/tp_pair_trace.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--sequence-parallel", "--keep", str(tmp_path / "sp")]) == 0
    records = load_trace(tmp_path / "sp")[0]
    steps, backward, tp = pair_steps(records)
    tensors = {s[1]: (s[2], s[4]) for s in steps if s[0] == "tensor"}
    # seq 4, batch 2, hidden 8 on 2 ranks: the script's defaults, as the trace recorded them
    assert tensors == {"x": ([2, 2, 8], "seq"), "x, gathered": ([4, 2, 8], None), "h": ([4, 2, 16], "hidden"),
                       "partial y": ([4, 2, 8], "partial"), "y": ([2, 2, 8], "seq")}
    # backward: the Row's reduce-scatter turned around, then the Column's re-gather and reduce-scatter
    assert tp == 2 and backward == ["all_gather", "all_gather", "reduce_scatter"]
    root = parse(shapes_svg([("sp", records)]))
    drawn = [g.get("data-shape") for g in root.iter(f"{NS}g") if g.get("data-tensor")]
    assert drawn == [str(s[2]) for s in steps if s[0] == "tensor"]
    parse(shapes_svg([("a", records), ("b", records)]))  # the right column's footer fits too
