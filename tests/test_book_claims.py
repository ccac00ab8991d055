"""Claims the walkthrough once got wrong, each checked the way it was found: by executing it.

The rule they all break is one rule: every number on a page is computed while the page is
built, or labelled as arithmetic. Each test below pins one place where a page said something
its own run did not show, so the mistake cannot come back unnoticed.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RUN = re.compile(r"<!--\s*(run|figure):\s*(.*?)\s*-->")


def example(name: str):
    """A script of docs/examples as a module (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs/examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chapter(prefix: str) -> str:
    return next((ROOT / "walkthrough").glob(f"{prefix}-*.md")).read_text()


def prose(text: str) -> str:
    """A page without its run lines and code blocks: what the author wrote by hand."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return RUN.sub("", text)


def shell(command: str) -> str:
    """A page's command as the build runs it: bash, in the repository root, venv first on PATH."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "80", "NO_COLOR": "1"}
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_ch17_share_of_the_layer_term_is_computed_from_the_printed_total():
    """The page said 99.98 %; with the P it prints (174,615,846,912) 12·L·h² is 99.62 %."""
    cost = example("layout_cost")
    args = cost.costs(8, 16, 1536, True)[0]
    total = cost.tmu.total_params(args)
    lines = cost.share_lines(args)
    assert f"{total:,}" in lines[0]
    share = 100 * 12 * args.num_layers * args.hidden_size ** 2 / total
    assert f"{share:.2f} %" in lines[1]
    page = chapter("17")
    assert "python docs/examples/layout_cost.py share" in page
    # and no share of P is written by hand any more
    assert not re.search(r"\d\.\d+ ?% of", prose(page))


def test_ch14_runs_the_include_its_prose_names_and_shows_world_info():
    """The prose named worker-0@worker-1:0,2 but ran worker-1:0,2, cut before world_info."""
    page = chapter("14")
    named = re.search(r"`(worker-0@worker-1:0,2)` keeps", page).group(1)
    command = next(c for kind, c in RUN.findall(page) if "--include" in c and "hostfile" in c)
    assert f"--include '{named}'" in command
    out = shell(command)
    assert "world_info" in out
    word = out.split("world_info", 1)[1].split()[-1]
    assert json.loads(base64.b64decode(word)) == {"worker-0": [0, 1], "worker-1": [0, 2]}


def test_ch01_timing_says_which_line_is_arithmetic():
    """"16 ranks, each a fresh interpreter: 13.34 s" read as measured; it is 16 x one import."""
    lines = example("journey_launch").timing_lines(16, 1.25, 0.1, 1.0)
    assert all(line.startswith(("measured:", "arithmetic")) for line in lines)
    product = [line for line in lines if "20.00" in line]
    assert len(product) == 1 and product[0].startswith("arithmetic, not run")
    assert "python docs/examples/journey.py timing 16" in (ROOT / "walkthrough/appendix-a-running-ranks.md").read_text()


def test_ch11_compares_schedules_on_unit_times_and_says_so():
    """Measured step times on a busy build machine drew bubbles no schedule has."""
    page = chapter("11")
    figures = [c for kind, c in RUN.findall(page) if kind == "figure" and "afab4" in c]
    assert figures and all("--unit" in c for c in figures)
    assert "unit times" in prose(page).lower()


def test_no_chapter_states_a_percentage_with_two_decimals_by_hand():
    """A hand-written 99.98 % is exactly the kind of figure that drifts from its run."""
    for page in sorted((ROOT / "walkthrough").glob("*.md")):
        found = re.findall(r"\d+\.\d\d ?%", prose(page.read_text()))
        assert not found, f"{page.name}: {found} written by hand; compute it in the build"



# --- the ways in: start here, the glossary, the map of the notes ---------------------------
WAYS_IN = ("index.md", "start-here.md", "glossary.md", "notes-map.md")
LINK = re.compile(r"\]\((?!https?:)([^)#\s]+)(?:#([^)\s]+))?\)")


def anchors(page: Path) -> set[str]:
    """The ids mkdocs gives the page's headings (the toc extension's own slugify)."""
    from markdown.extensions.toc import slugify  # mkdocs' markdown: the ids the site will have

    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {slugify(title, "-") for title in re.findall(r"^#{1,6} (.+?)\s*$", text, re.M)}


def test_every_link_of_the_ways_in_reaches_a_page_and_a_heading():
    for name in WAYS_IN:
        links = LINK.findall((ROOT / "docs" / name).read_text())
        assert links or name == "index.md", f"{name} links nowhere"
        for target, anchor in links:
            page = (ROOT / "docs" / target).resolve()
            assert page.is_file(), f"{name}: {target} does not exist"
            assert not anchor or anchor in anchors(page), f"{name}: no heading #{anchor} in {target}"


def test_the_notes_map_cites_commands_its_chapters_run():
    """"executed there" must be true: the cited command is a run line of the linked page."""
    rows = [line for line in (ROOT / "docs/notes-map.md").read_text().splitlines()
            if line.startswith("| ") and "](" in line]
    assert len(rows) > 40
    for row in rows:
        target = LINK.search(row).group(1)
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        command = re.fullmatch(r"`([^`]+)`", cells[-1])
        if command:
            runs = [c for _, c in RUN.findall((ROOT / "docs" / target).read_text())]
            assert any(command.group(1) in run for run in runs), f"{target} runs no {command.group(1)!r}"


def test_start_here_commands_name_real_commands_and_flags():
    from typer.testing import CliRunner  # the app's own help, in this process

    from minitron.cli import app

    # A long command is folded with " \\" at the end of a line, as a shell reads it.
    text = re.sub(r" \\\n\s+", " ", (ROOT / "docs/start-here.md").read_text())
    commands = re.findall(r"^ {8}(minitron .+)$", text, re.M)
    assert len(commands) >= 10
    helps: dict[str, str] = {}
    for command in commands:
        words = command.split()
        if words[1] not in helps:
            helps[words[1]] = CliRunner().invoke(app, [words[1], "--help"], env={"COLUMNS": "200"}).output
        assert "Usage:" in helps[words[1]], f"no command {words[1]}"
        if "Every other flag is" in helps[words[1]]:
            continue  # pretrain and estimate hand Megatron's flags on; validate_args checks those
        for flag in (w for w in words if w.startswith("--")):
            assert flag in helps[words[1]], f"{command}: {flag} is not an option of minitron {words[1]}"
    for script in re.findall(r"^ {8}python (\S+)", text, re.M):
        assert (ROOT / script).is_file(), script


def test_ch19_prints_each_no_effect_list_once():
    """The page showed a script's "accepted, no effect here" list in its verdicts, then again at
    the top of every estimate and trace of that script: four times for one content. The verdicts
    keep it; the other commands drop it, wrapped continuation lines included. Nor does the page
    assume an iteration time: `--cluster h100` derives it from the recorded run."""
    page = chapter("19")
    runs = [c for kind, c in RUN.findall(page) if "script_flags.py argv" in c]
    assert runs and not any("--iteration-time" in c for c in runs)
    for command in runs:
        assert "awk '/^accepted, no effect/" in command or re.search(r"\| (grep|tail) ", command), command
    mixtral = next(c for c in runs if c.startswith("minitron estimate") and "mixtral_8x7b" in c)
    out = shell(mixtral)
    assert "largest rank" in out
    # the list has a line wider than the page (--no-masked-softmax-fusion's reason), wrapped
    assert "no effect" not in out and "compute the same" not in out


def test_ch17b_memory_falls_short_of_the_recorded_peak_by_about_a_tenth(capsys):
    """Chapter 17b reads the estimate's memory for the recorded H100 model as short of the run's
    allocated peak by about a tenth (what a step allocates and frees is not counted), and the
    FLOPs as the very count the bench divided by."""
    example("time_vs_recorded").main()
    out = capsys.readouterr().out
    assert "(the same count)" in out
    kept, peak = map(float, re.search(r"memory: estimate ([\d.]+) GiB kept, recorded peak ([\d.]+) GiB", out).groups())
    assert 0.85 <= kept / peak < 1.0, (kept, peak)
    assert "falls short of it by about a tenth" in " ".join(chapter("17b").split())


def test_ch19_names_as_refused_only_flags_minitron_refuses():
    """Chapter 19 listed fp8 weights and a learned softmax as refused after both had been built."""
    from minitron.training.arguments_policy import REFUSED

    bullet = re.search(r"^- \*\*refused\*\*:(.*?)(?=^\S)", chapter("19"), re.S | re.M).group(1)
    named = re.findall(r"`(--[a-z0-9-]+)`", bullet)
    assert named and all(flag in REFUSED for flag in named), named


def test_the_glossary_defines_what_issue_40_found_missing():
    """The glossary once had about 35 terms and none of the collectives; the terms the chapters use
    from the first page on each get a line of their own (a term is the bold head of an entry)."""
    heads = " ".join(re.findall(r"^\*\*(.+?)\*\*", (ROOT / "docs/glossary.md").read_text(), re.M))
    for term in ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "broadcast", "bucket", "main_grad",
                 "no_sync", "DCP", "ShardedTensor", "universal checkpoint", "router", "capacity factor", "MFU",
                 "rendezvous", "TCPStore", "fp8", "FSDP", "ZeRO++", "Mamba", "ring, tree", "NVLink",
                 "cluster description", "fused kernel", "rope", "grouped-query attention", "multi-latent attention"):
        assert term in heads, f"the glossary has no entry for {term!r}"
