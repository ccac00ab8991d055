"""`minitron groups` at production sizes (issue 30): a summary of 131,072 ranks, one rank's view
(--rank), and that rank's groups drawn over a 16,384-rank job's nodes, checked in headless
Chromium at a laptop's 1280 px."""

from __future__ import annotations

import json
import re

import pytest

from chromium import Browser, find_chromium
from cli_here import minitron_here

from minitron.core.group_layout import layout, rank_coordinates, rank_layout

BIG = ["--world", "131072", "--tp", "8", "--pp", "16", "--cp", "2", "--ep", "8"]
JOB = ["--world", "16384", "--tp", "8", "--pp", "16", "--cp", "2", "--ep", "8"]


@pytest.mark.parametrize("world", [pytest.param(131072, marks=pytest.mark.stress), 16384])
def test_a_huge_world_is_summarised_not_listed(world):
    """131,072 takes a second to lay out (a stress test); 16,384 shows the same in a tenth."""
    done = minitron_here("groups", "--world", str(world), *BIG[2:])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) < 100 and f"tp: tensor parallel ({world // 8} groups of 8)" in done.stdout
    assert f"… ({world // 16} groups)" in done.stdout   # the pipeline groups: the first dozen, then the count


def test_one_rank_of_a_huge_world():
    done = minitron_here("groups", *BIG, "--rank", "12345", env={"COLUMNS": "100"})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "rank 12,345 of 131,072 ranks = tp 8 × cp 2 × dp 512 × pp 16, ep 8" in out
    assert "node 1,543 (GPU 1 of its 8)" in out
    assert re.search(r"│ tp +│ +8 │ +1 │ \[12344-12351\] +│ +1 │", out)
    assert "in no EMBEDDING_GROUP" in out          # stage 1 of 16 holds no embedding
    assert "prev rank 4,153, next rank 20,537" in out


def test_one_rank_as_json_is_its_part_of_the_layout():
    whole = layout(64, 2, 4, 2, 2)
    for rank in (0, 13, 63):
        done = minitron_here("groups", "--world", "64", "--tp", "2", "--pp", "4", "--cp", "2", "--ep", "2",
                             "--rank", str(rank), "--json")
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        assert got["coordinates"] == rank_coordinates(rank, 64, 2, 4, 2)
        assert got["groups"] == {k: g for k, groups in whole.items() for g in groups if rank in g and k in got["groups"]}
        assert set(got["groups"]) >= {"tp", "dp", "pp", "cp", "ep"}


@pytest.fixture(scope="module")
def nodes_svg():
    done = minitron_here("groups", *JOB, "--rank", "12345", "--svg")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_node_picture_lights_the_nodes_of_each_group(nodes_svg):
    own = rank_layout(12345, 16384, 8, 16, 2, 8)
    panels = dict(re.findall(r'<g data-kind="(\w+)" data-nodes="(\d+)">', nodes_svg))
    # Nearest first; tp stays inside the rank's node, so it is a line of text, not a panel.
    assert list(panels) == ["cp", "ep", "pp", "dp"] and "inside node 1543: tp [12344-12351]" in nodes_svg
    for kind, nodes in panels.items():
        assert int(nodes) == len({r // 8 for r in own[kind]}), kind
    lit = re.findall(r'<g data-node="(\d+)" data-members="(\d+)">', nodes_svg)
    assert sum(int(m) for _, m in lit) == sum(len(own[k]) for k in panels)
    assert len(nodes_svg) < 64_000   # the grid is a pattern: only the lit nodes are drawn


@pytest.mark.stress   # a browser start is ~2 s; in the default run test_pages_browser.py checks chapter 6's copy
@pytest.mark.skipif(find_chromium() is None, reason="no chromium installed (apt-get install chromium)")
def test_the_node_picture_reads_at_1280_px(nodes_svg, tmp_path):
    """Opened on its own at 1280 x 800: no sideways scroll, every text inside the picture, no
    text under 10 px, and a node cell big enough to see (at least 6 px)."""
    (tmp_path / "nodes.svg").write_text(nodes_svg)
    browser = Browser(width=1280, height=800)
    try:
        browser.open((tmp_path / "nodes.svg").as_uri())
        seen = browser.evaluate("""(() => {
            const svg = document.documentElement, box = svg.getBoundingClientRect();
            const scale = box.width / svg.viewBox.baseVal.width;
            const texts = [...svg.querySelectorAll('text')].map(t => t.getBoundingClientRect());
            const cell = svg.querySelector('[data-node] rect').getBoundingClientRect();
            return {scroll: document.documentElement.scrollWidth - window.innerWidth,
                    outside: texts.filter(r => r.right > box.right + 0.5 || r.left < box.left - 0.5).length,
                    smallest: Math.min(...[...svg.querySelectorAll('text')].map(
                        t => parseFloat(t.getAttribute('font-size')) * scale)),
                    cell: cell.width, width: box.width};
        })()""")
    finally:
        browser.close()
    assert seen["scroll"] <= 0 and seen["width"] <= 1280, seen
    assert seen["outside"] == 0, seen
    assert seen["smallest"] >= 10 and seen["cell"] >= 6, seen


def test_one_group_of_the_whole_world_is_joined_in_linear_time():
    """The distributed optimizer's instance group is every tp-ep-pp group end to end: at tp = ep =
    pp = 1, 131,072 groups of one. Joined by adding tuples (quadratic) that took over 30 s here
    (and `groups --world 100000` 19.5 s); joined in one pass, about 0.1 s.

    Held as a growth rate, not a time: eight times the world must cost well under the 64 times a
    quadratic join would (linear measured ~10 times, the lists' allocation included), each size
    timed at its best of three in this process's CPU time, which other processes on a busy
    machine do not lengthen (wall time did: 42 times, once, with 20 processes on 2 cores)."""
    import time

    def best(world: int) -> tuple[float, dict]:
        times = []
        for _ in range(3):
            start = time.process_time()
            made = rank_layout(0, world)
            times.append(time.process_time() - start)
        return min(times), made

    big, made = best(131072)
    assert made["intra-dist-opt"] == list(range(131072))
    growth = big / best(16384)[0]
    assert growth < 25, f"8 times the world took {growth:.0f} times as long: the join is not linear"


@pytest.fixture(scope="module")
def rank0_of_131072(tmp_path_factory):
    """Rank 0 of a 131,072-rank world, played alone on the fake backend."""
    out = tmp_path_factory.mktemp("big-trace") / "trace"
    done = minitron_here("trace", "--backend", "fake", *BIG, "--ranks", "0", "--out", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def test_every_trace_line_stays_far_below_the_readers_limit(rank0_of_131072):
    """The whole-world group (the distributed optimizer's instance) once made one new_group line
    of ~800 KB, near the reader's 1 MiB; its ranks are now recorded as a progression, and the
    reader gives every view the list back."""
    from minitron.trace.reader import load_trace
    from minitron.trace.schema import MAX_LINE_BYTES, NEW_GROUP

    lines = (rank0_of_131072 / "rank0.jsonl").read_bytes().splitlines()
    longest = max(len(line) for line in lines)
    assert longest < MAX_LINE_BYTES // 64, f"a line of {longest:,} bytes"
    groups = {r["args"]["group_desc"]: r["args"]["ranks"]
              for r in load_trace(rank0_of_131072)[0] if r["name"] == NEW_GROUP}
    own = rank_layout(0, 131072, 8, 16, 2, 8)
    assert groups["INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP"] == own["intra-dist-opt"]
    assert len(own["intra-dist-opt"]) == 131072
    assert groups["DATA_PARALLEL_GROUP_WITH_CP"] == own["dp-cp"]


def test_a_group_is_written_as_its_progression_and_read_back():
    from minitron.trace.group_ranks import LIST_UP_TO, compact_ranks, expand_ranks

    for world, sizes, order in ((4096, (2, 4, 2, 4), "tp-cp-ep-dp-pp"), (4096, (2, 2, 2, 2), "tp-cp-ep-pp-dp")):
        for kind, groups in layout(world, *sizes, order=order).items():
            for ranks in groups:
                written = compact_ranks(ranks)
                assert (written if isinstance(written, list) else expand_ranks(written, world)) == ranks, kind
                assert len(json.dumps(written)) < 200 or len(ranks) <= LIST_UP_TO, (kind, written)
    scattered = [r * r for r in range(100)]                    # no progression: written as it is
    assert compact_ranks(scattered) == scattered


@pytest.mark.parametrize("ranks,words", [({"first": 0, "dims": [[1 << 20, 1]]}, "more than 131072 ranks"),
                                         ({"first": 0, "dims": [[4, "8"]]}, "not a [size, stride] pair"),
                                         ({"first": 0}, 'not {"first": R')])
def test_a_bad_progression_is_one_line(rank0_of_131072, tmp_path, ranks, words):
    from minitron.trace.reader import TraceError, load_trace

    lines = (rank0_of_131072 / "rank0.jsonl").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"first"' in line)
    record = json.loads(lines[at])
    record["args"]["ranks"] = ranks
    lines[at] = json.dumps(record)
    (tmp_path / "rank0.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as refused:
        load_trace(tmp_path)
    assert words in str(refused.value) and f"rank0.jsonl:{at + 1}" in str(refused.value)
