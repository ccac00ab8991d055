"""The documentation site builds, and every command and code excerpt it names exists.

The full build (``mkdocs build --strict``) runs every ``<!-- run: -->`` command (or finds its
output kept for code that has not changed: docs/hooks/page_cache.py), so it is the real test
that nothing on the site is stale. The fast tests around it say *which* reference broke without
waiting for the build. The hooks' own behaviour: tests/test_docs_hooks.py; the pages as a
browser lays them out: tests/test_pages_browser.py.
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import tempfile
import time
import xml.etree.ElementTree as ElementTree
import shlex
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SNIPPET = re.compile(r'--8<--\s+"(?P<target>[^"]+)"')
SHELL_WORDS = {"cd", "echo", "mkdir", "sort", "head", "tail", "true", "grep", "cat", "test"}


def load_hook(name: str = "run_commands"):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"docs/hooks/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markdown_pages() -> list[Path]:
    """Every page of the site once: docs/ without the walkthrough symlink, plus walkthrough/."""
    pages = [p for p in (ROOT / "docs").rglob("*.md") if "walkthrough" not in p.relative_to(ROOT / "docs").parts]
    return sorted(pages + list((ROOT / "walkthrough").glob("*.md")))


def run_commands(page: Path) -> list[str]:
    """The commands of a page's run lines, parsed as the build hook parses them."""
    return load_hook().run_commands(page.read_text())


def minitron_commands() -> set[str]:
    from minitron.cli import app
    return {c.name or c.callback.__name__ for c in app.registered_commands}


# The slow one: the real, strict build. -------------------------------------------------------
def test_site_builds_strict(site_build):
    site, code, stdout, stderr = site_build   # started when the tests were collected (conftest)
    assert code == 0, f"mkdocs build --strict failed:\n{stdout}\n{stderr}"
    for page in ("index.html", "quickstart/index.html", "cli/index.html", "gallery/index.html",
                 "walkthrough/01-launching-ranks/index.html"):
        assert (site / page).is_file(), f"{page} was not built"
    # The hook really ran the commands: a help text and a computed group list are in the HTML.
    assert "Usage: minitron trace" in (site / "cli/index.html").read_text()
    assert "<!-- run:" not in (site / "gallery/index.html").read_text()
    check_built_site(site)


OUTPUT_BLOCK = re.compile(r'<div class="(?P<classes>[^"]*)highlight"><pre>(?P<body>.*?)</pre>', re.S)
FIGURE = re.compile(r'<figure class="minitron-figure"[^>]*>\s*(?P<svg><svg.*?</svg>)\s*</figure>', re.S)
PICTURED = {"gallery": 4, "walkthrough/06-process-groups": 2, "walkthrough/09-tensor-parallelism": 1,
            "walkthrough/10-training-loop": 1, "walkthrough/11-pipeline-schedules": 2,
            "walkthrough/13-mixed-precision": 1}


def build_machine_paths() -> list[str]:
    """Paths that only mean something on the machine that built the site."""
    home = os.path.expanduser("~")
    paths = {str(ROOT), "/tmp/", tempfile.gettempdir().rstrip("/") + "/", "/work/"}
    return sorted(paths | ({home + "/"} if home not in ("/", "") else set()))


def check_built_site(site: Path) -> None:
    """Every page: no path of the build machine; every executed output fits the content column
    (WIDTH characters; tests/test_pages_browser.py checks in a browser that the column holds
    them); every picture a well-formed SVG; the chapters that draw pictures have them."""
    hook = load_hook()
    paths = build_machine_paths()
    build_time = log_time(os.environ.get("SOURCE_DATE_EPOCH") or hook.source_date_epoch(ROOT))
    for page in sorted(site.rglob("*.html")):
        name = str(page.parent.relative_to(site))
        text = page.read_text()
        # A placeholder path is documentation, not this machine's: DeepSpeed's pid file
        # /tmp/<pid>.deepspeed is named so in --save_pid's help and in chapter 14.
        scanned = text.replace("/tmp/&lt;", "&lt;")
        for path in paths:
            assert path not in scanned, f"{name} shows {path!r}, a path of the machine that built it"
        for block in OUTPUT_BLOCK.finditer(text):
            if "no-copy" not in block["classes"].split():
                continue  # a code excerpt or a block written in the page, not an output
            lines = html.unescape(re.sub(r"<[^>]+>", "", block["body"])).split("\n")
            longest = max(len(line) for line in lines)
            noise = run_to_run_noise("\n".join(lines), build_time)
            assert not noise, f"{name}: an output shows what changes from run to run: {noise[:3]}"
            assert longest <= hook.WIDTH, \
                f"{name}: an output line of {longest} characters, wider than the column's {hook.WIDTH}: " \
                f"{next(line for line in lines if len(line) == longest)[:60]!r}"
        figures = FIGURE.findall(text)
        for svg in figures:
            ElementTree.fromstring(svg)
        if name in PICTURED:
            assert len(figures) >= PICTURED[name], f"{name} has {len(figures)} pictures, not {PICTURED[name]}"


# Two builds of the same code give the same pages, but for what a page says it measured (a
# duration, a CPU time). What would differ besides is recognisable: a pid, a port picked free
# (the kernel's from 32768 up, launch.free_port's from 16384 to below the kernel's range; the
# port given on purpose, torchrun's 29500, is the one five-digit port a page may show), a
# clock time other than the one the build tells the training log (SOURCE_DATE_EPOCH).
PID = re.compile(r"(?<![a-z])pid\b\W{0,3}\d{2,}|[┃│]\s*pid\s*[┃│]", re.I)
PORT = re.compile(r"(?<![a-z])port\b\W{0,3}(\d{5})", re.I)
CLOCK = re.compile(r"\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d\b")
GIVEN_PORT = 29500   # torchrun's default --master-port, shown on purpose


def log_time(epoch: str) -> str | None:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(epoch))) if epoch.isdigit() else None


def run_to_run_noise(text: str, build_time: str | None) -> list[str]:
    found = [m[0] for m in PID.finditer(text)]
    found += [m[0] for m in PORT.finditer(text) if 16384 <= int(m[1]) <= 65535 and int(m[1]) != GIVEN_PORT]
    found += [m[0] for m in CLOCK.finditer(text) if m[0] != build_time]
    return found


def test_the_noise_finder_finds_pids_free_ports_and_clock_times():
    build = "2026-01-02 03:04:05"
    assert run_to_run_noise("rank 0 (pid 1234)", build) == ["pid 1234"]
    assert run_to_run_noise("┃ rank ┃   pid ┃ tp ┃", build) == ["┃   pid ┃"]
    assert run_to_run_noise("MASTER_PORT=40963", build) == ["PORT=40963"]
    assert run_to_run_noise("MASTER_PORT=23117", build) == ["PORT=23117"]   # launch.free_port's range
    assert run_to_run_noise(" [2026-11-25 17:32:17] iteration 4/12 |", build) == ["2026-11-25 17:32:17"]
    calm = f"MASTER_PORT=29500 --master_port=29500 [{build}] iteration 1 | --save_pid writes <pid>"
    assert run_to_run_noise(calm, build) == []


# Fast checks of what the pages refer to. ------------------------------------------------------
def test_every_snippet_reference_resolves():
    names = load_hook("snippet_names")
    checked = 0
    for page in markdown_pages():
        for match in SNIPPET.finditer(page.read_text()):
            target = match["target"]
            path, _, section = target.partition(":")
            source = ROOT / path
            where = f"{page.relative_to(ROOT)} includes {target!r}"
            assert source.is_file(), f"{where}, but {path} does not exist"
            if section and names.SNIPPET_LINE.match(match.group(0)) and not names.has_section(source.read_text(), section):
                # A definition's name (docs/hooks/snippet_names.py turns it into line numbers).
                names.resolve(ROOT, path, section)  # LookupError if it names nothing
            elif section:
                # pymdownx.snippets only reads a name that starts with a letter as a section;
                # anything else becomes part of the file name, and the file is "not found".
                assert re.fullmatch(r"[a-z][-_0-9a-z]*", section), \
                    f"{where}: section names must match [a-z][-_0-9a-z]* (start with a letter)"
                text = source.read_text()
                for end in ("start", "end"):
                    assert re.search(rf"\[\s*{end}\s*:\s*{re.escape(section)}\s*\]", text), \
                        f"{where}, but {path} has no [{end}:{section}] marker"
            checked += 1
    assert checked > 0


def shell_parts(command: str) -> list[list[str]]:
    """The words of each simple command of a shell line, split at |, ||, && and ; as the shell
    splits them: outside quotes only (a quoted layout string such as "Et|t*2L" is one word)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    parts = [[]]
    for token in lexer:
        if token in ("|", "||", "&&", ";"):
            parts.append([])
        else:
            parts[-1].append(token)
    return [p for p in parts if p]


def test_every_run_command_names_something_that_exists():
    subcommands = minitron_commands()
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    checked = 0
    for page in markdown_pages():
        for command in run_commands(page):
            where = f"{page.relative_to(ROOT)}: <!-- run: {command} -->"
            for words in shell_parts(command):
                if not words:
                    continue
                program = words[0]
                assert program in SHELL_WORDS or shutil.which(program, path=path), \
                    f"{where}: no program {program!r}"
                if program == "minitron" and not words[1].startswith("-"):
                    assert words[1] in subcommands, f"{where}: minitron has no command {words[1]!r}"
                if program in ("python", "python3", "torchrun"):
                    scripts = [w for w in words[1:] if w.endswith(".py")]
                    for script in scripts:
                        assert (ROOT / script).is_file(), f"{where}: no script {script}"
            checked += 1
    assert checked > 0


def test_cli_reference_covers_every_command():
    page = (ROOT / "docs/cli.md").read_text()
    missing = [c for c in sorted(minitron_commands()) if f"<!-- run: minitron {c} --help -->" not in page]
    assert not missing, f"docs/cli.md has no help section for: {', '.join(missing)}"


def test_every_chapter_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    for chapter in sorted((ROOT / "walkthrough").glob("[0-9][0-9]*-*.md")):
        assert f"walkthrough/{chapter.name}" in nav, f"mkdocs.yml nav does not list {chapter.name}"
    for listed in re.findall(r"walkthrough/[\w.-]+\.md", nav):
        assert (ROOT / listed).is_file(), f"mkdocs.yml nav lists {listed}, which does not exist"
