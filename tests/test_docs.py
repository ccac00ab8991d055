"""The documentation site builds, and every command and code excerpt it names exists.

The full build (``mkdocs build --strict``) runs every ``<!-- run: -->`` command, so it is the
real test that nothing on the site is stale. The fast tests around it say *which* reference
broke without waiting for the build, and pin down the build hook's own behaviour.
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
import subprocess
import sys
from pathlib import Path

import pytest

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
# (the kernel hands those out from 32768 up; a port given on purpose, 29500, is below), a
# clock time other than the one the build tells the training log (SOURCE_DATE_EPOCH).
PID = re.compile(r"(?<![a-z])pid\b\W{0,3}\d{2,}|[┃│]\s*pid\s*[┃│]", re.I)
PORT = re.compile(r"(?<![a-z])port\b\W{0,3}(\d{5})", re.I)
CLOCK = re.compile(r"\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d\b")


def log_time(epoch: str) -> str | None:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(epoch))) if epoch.isdigit() else None


def run_to_run_noise(text: str, build_time: str | None) -> list[str]:
    found = [m[0] for m in PID.finditer(text)]
    found += [m[0] for m in PORT.finditer(text) if 32768 <= int(m[1]) <= 65535]
    found += [m[0] for m in CLOCK.finditer(text) if m[0] != build_time]
    return found


def test_the_noise_finder_finds_pids_free_ports_and_clock_times():
    build = "2026-01-02 03:04:05"
    assert run_to_run_noise("rank 0 (pid 1234)", build) == ["pid 1234"]
    assert run_to_run_noise("┃ rank ┃   pid ┃ tp ┃", build) == ["┃   pid ┃"]
    assert run_to_run_noise("MASTER_PORT=40963", build) == ["PORT=40963"]
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


def test_every_run_command_names_something_that_exists():
    subcommands = minitron_commands()
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    checked = 0
    for page in markdown_pages():
        for command in run_commands(page):
            where = f"{page.relative_to(ROOT)}: <!-- run: {command} -->"
            for part in re.split(r"&&|\|\||[|;]", command):
                words = shlex.split(part)
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
    for chapter in sorted((ROOT / "walkthrough").glob("[0-9][0-9]-*.md")):
        assert f"walkthrough/{chapter.name}" in nav, f"mkdocs.yml nav does not list {chapter.name}"
    for listed in re.findall(r"walkthrough/[\w.-]+\.md", nav):
        assert (ROOT / listed).is_file(), f"mkdocs.yml nav lists {listed}, which does not exist"


# The hook's own behaviour, on tiny pages. ----------------------------------------------------
def test_run_line_becomes_its_output_in_a_text_block(tmp_path):
    hook = load_hook()
    hook._cache.clear()
    page = "intro\n<!-- run: printf '\\033[31mred\\033[0m and plain\\n' -->\nend"
    out = hook.expand(page, "page.md", tmp_path)
    assert out == "intro\n```{.text .no-copy}\nred and plain\n```\nend"


def test_run_lines_inside_fences_and_admonitions(tmp_path):
    hook = load_hook()
    hook._cache.clear()
    page = "```markdown\n<!-- run: false -->\n```\n!!! note\n    <!-- run: echo $COLUMNS $NO_COLOR -->"
    out = hook.expand(page, "page.md", tmp_path)
    assert "<!-- run: false -->" in out                       # shown as syntax, not run
    assert "    ```{.text .no-copy}\n    120 1\n    ```" in out  # indented like the comment


def test_failing_command_names_page_and_command(tmp_path):
    from mkdocs.exceptions import PluginError
    hook = load_hook()
    hook._cache.clear()
    with pytest.raises(PluginError) as failure:
        hook.expand("<!-- run: echo oops; exit 3 -->", "walkthrough/99-x.md", tmp_path)
    message = str(failure.value)
    assert "walkthrough/99-x.md" in message and "exit 3" in message and "code 3" in message
    assert "oops" in message


def test_identical_commands_run_once_per_build(tmp_path):
    hook = load_hook()
    hook._cache.clear()
    counter = tmp_path / "count"
    command = f"echo x >> {counter}; wc -l < {counter}"
    first = hook.expand(f"<!-- run: {command} -->", "a.md", tmp_path)
    second = hook.expand(f"<!-- run: {command} -->", "b.md", tmp_path)
    assert first == second and counter.read_text() == "x\n"
    hook.on_pre_build(None)                                   # a new build runs it again
    hook.expand(f"<!-- run: {command} -->", "a.md", tmp_path)
    assert counter.read_text() == "x\nx\n"


def test_commands_run_in_a_scratch_directory_with_the_venv_first_on_path(tmp_path):
    hook = load_hook()
    hook._cache.clear()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts/hello.sh").write_text("echo hello from $0")
    try:
        out = hook.expand("<!-- run: pwd; command -v python; bash scripts/hello.sh; mkdir made; "
                          "echo $PWD/made; echo " + str(tmp_path) + "/x -->", "page.md", tmp_path)
        scratch = hook.scratch_dir(tmp_path)
        assert (scratch / "made").is_dir() and not (tmp_path / "made").exists()  # writes stay out of the root
    finally:
        hook.on_post_build(None)
    lines = out.split("\n")
    assert lines[1] == "."                                  # the scratch directory, shown relative
    assert Path(lines[2]).parent == BIN
    assert lines[3] == "hello from scripts/hello.sh"        # the root's files are there
    assert lines[4] == "made" and lines[5] == "x"           # no path of this machine is shown
    assert not scratch.exists()                             # and the scratch is gone with the build


def test_figure_line_becomes_the_svg_it_printed(tmp_path):
    from mkdocs.exceptions import PluginError
    hook = load_hook()
    hook._cache.clear()
    good = "printf '<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 1 1\">\\n\\n<rect/></svg>\\n'"
    try:
        out = hook.expand(f"<!-- figure: {good} -->", "page.md", tmp_path)
        assert out.startswith('<figure class="minitron-figure" markdown="0">\n<svg ') and out.endswith("</figure>")
        assert "\n\n" not in out                               # a blank line would end the HTML block
        for bad, why in (("echo '<svg><rect></svg>'", "well-formed"), ("echo '<p>hi</p>'", "not an <svg>")):
            with pytest.raises(PluginError) as failure:
                hook.expand(f"<!-- figure: {bad} -->", "walkthrough/99-x.md", tmp_path)
            assert "walkthrough/99-x.md" in str(failure.value) and why in str(failure.value)
    finally:
        hook.on_post_build(None)


def test_wide_output_lines_fold_at_spaces_and_keep_their_font(tmp_path):
    hook = load_hook()
    assert hook.fold("x" * hook.WIDTH) == ["x" * hook.WIDTH]   # a fitting line is left alone
    long = "  error: " + " ".join(["word"] * 60)
    folded = hook.fold(long)
    assert all(len(line) <= hook.WIDTH for line in folded) and len(folded) > 1
    assert " ".join(part.strip() for part in folded) == long.strip()
    assert all(line.startswith("    ") for line in folded[1:])  # under the line's first word
    block = hook.fenced("short\n" + long, "")
    assert block[0] == "```{.text .no-copy}"                      # no class that shrinks the font
    assert block[1:-1] == ["short", *folded]
    assert "stylesheets/output.css" in (ROOT / "mkdocs.yml").read_text()


def test_piped_and_or_echo_commands_run_warm_and_print_what_bash_prints(tmp_path):
    """`A | sort`, `A 2>&1 | tail -2`, `A 2>&1 || echo "(exit code $?)"` run from the warm
    process (no torch import per command) yet print what bash prints; a piped call that writes
    to stderr, or fails, is run by bash after all (its output's place among the lines is bash's)."""
    hook = load_hook()
    (tmp_path / "p.py").write_text("import sys\nprint('b'); print('a'); print('c')\n"
                                   "if sys.argv[1:] == ['err']: print('oops', file=sys.stderr)\n"
                                   "sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)\n")
    commands = ["python p.py | sort", "python p.py x 0 2>&1 | tail -2", "python p.py x 3 2>&1 || echo \"(exit code $?)\"",
                "python p.py > /dev/null && python p.py | grep -v a", "python p.py err | sort"]
    warm = hook._warm.module
    assert [warm.warm_plan(c, str(BIN)) is not None for c in commands] == [True] * 5
    assert warm.warm_plan("python p.py 2>/dev/null | sort", str(BIN)) is None
    assert warm.warm_plan("python p.py | sort | head -1", str(BIN)) is None
    try:
        for command in commands:
            hook._cache.clear()
            plan = warm.warm_plan(command, str(BIN))
            done, _ = hook._run_warm(plan, hook.scratch_dir(tmp_path))
            bash = subprocess.run(["bash", "-c", command], cwd=hook.scratch_dir(tmp_path), env=hook.command_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if command.endswith("err | sort"):
                assert done is None   # stderr beside a pipe: left to bash
            else:
                assert done == (bash.returncode, bash.stdout), command
    finally:
        hook.on_post_build(None)


def test_a_pages_outputs_are_kept_under_a_key_of_its_commands_and_sources(tmp_path):
    """docs/hooks/page_cache.py: the key moves with the commands, with any source file the
    commands run, and with a file a command names; a found page is not run at all."""
    hook = load_hook()
    cache = hook.page_cache
    for path, text in {"minitron/a.py": "A = 1\n", "scripts/s.py": "print(1)\n", "tests/t.py": "x\n",
                       "walkthrough/01.md": "prose\n"}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    files = cache.checkout_files(tmp_path)
    assert "minitron/a.py" in files and not any(f.startswith(".cache") for f in files)

    def key(commands):
        return cache.page_key(tmp_path, cache.sources_digest(tmp_path, files, {"width": "120"}), set(files), commands)

    first = key(["python scripts/s.py", "python tests/t.py"])
    assert key(["python scripts/s.py", "python tests/t.py"]) == first
    assert key(["python tests/t.py", "python scripts/s.py"]) != first        # the order counts
    (tmp_path / "walkthrough/01.md").write_text("other prose\n")
    assert key(["python scripts/s.py", "python tests/t.py"]) == first        # prose does not
    for path in ("minitron/a.py", "tests/t.py"):                              # code does
        (tmp_path / path).write_text("changed\n")
        assert key(["python scripts/s.py", "python tests/t.py"]) != first
    assert cache.load(tmp_path, first) is None
    cache.store(tmp_path, first, "p.md", ["false"], ["kept output"])
    assert cache.load(tmp_path, first) == ["kept output"]
    # A page given its outputs does not run its commands (`false` would fail the page).
    assert hook.expand("<!-- run: false -->", "p.md", tmp_path, ["kept output"]) == \
        "```{.text .no-copy}\nkept output\n```"
    # The training log's time is the build's (SOURCE_DATE_EPOCH), not the one the entry ran with.
    cache.store(tmp_path, first, "p.md", ["x"], ["[1970-01-02 00:00:00] iteration 1 |"], epoch="86400")
    assert cache.load(tmp_path, first, "86400") == ["[1970-01-02 00:00:00] iteration 1 |"]
    assert cache.load(tmp_path, first, "90000") == ["[1970-01-02 01:00:00] iteration 1 |"]
    cache.prune(tmp_path, set())
    assert cache.load(tmp_path, first) is None


def test_the_training_log_prints_the_time_the_build_gives_it(monkeypatch):
    from minitron.training.training_log import log_time  # here: it brings torch, which the page checks do not need
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "86400")
    assert log_time() == "1970-01-02 00:00:00"
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert log_time() != "1970-01-02 00:00:00"
