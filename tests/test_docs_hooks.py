"""The build hooks' own behaviour (docs/hooks/), on tiny pages in a temporary folder: how a run
line becomes a block, where and how its command runs, how outputs are kept between builds.
tests/test_docs.py checks the real pages and the real build."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from test_docs import BIN, ROOT, load_hook


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
    # The venv's python; shown relative when it lies in the checkout the commands import minitron from.
    assert Path(ROOT, lines[2]).parent == BIN
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


@pytest.fixture(scope="module")
def warm_hook():
    """One hook for the tests of the warm runner: starting it is an `import torch` and the
    launcher's warm-up (~3 s of CPU), which each test paid for again with a hook of its own."""
    hook = load_hook()
    hook.command_run.warm.expected = True   # as in a build with pages to run (on_files sets it)
    yield hook
    hook.on_post_build(None)


def test_piped_and_or_echo_commands_run_warm_and_print_what_bash_prints(tmp_path, warm_hook):
    """`A | sort`, `A 2>&1 | tail -2`, `A 2>&1 || echo "(exit code $?)"` run from the warm
    process (no torch import per command) yet print what bash prints; a piped call that writes
    to stderr, or fails, is run by bash after all (its output's place among the lines is bash's)."""
    hook = warm_hook
    (tmp_path / "p.py").write_text("import sys\nprint('b'); print('a'); print('c')\n"
                                   "if sys.argv[1:] == ['err']: print('oops', file=sys.stderr)\n"
                                   "sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)\n")
    commands = ["python p.py | sort", "python p.py x 0 2>&1 | tail -2", "python p.py x 3 2>&1 || echo \"(exit code $?)\"",
                "python p.py > /dev/null && python p.py | grep -v a", "python p.py err | sort"]
    warm = hook.command_run.warm.module
    assert [warm.warm_plan(c, str(BIN)) is not None for c in commands] == [True] * 5
    assert warm.warm_plan("python p.py 2>/dev/null | sort", str(BIN)) is None
    assert warm.warm_plan("python p.py | sort | head -1", str(BIN)) is None
    for command in commands:
        hook._cache.clear()
        plan = warm.warm_plan(command, str(BIN))
        done, _ = hook.command_run.run_warm(plan, hook.scratch_dir(tmp_path))
        bash = subprocess.run(["bash", "-c", command], cwd=hook.scratch_dir(tmp_path), env=hook.command_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if command.endswith("err | sort"):
            assert done is None   # stderr beside a pipe: left to bash
        else:
            assert done == (bash.returncode, bash.stdout), command


# docs/hooks/warm_shim.py: in a command that bash runs, `minitron` and `python` are stand-ins
# that fork the call from the build's warm runner. Such a call really runs warm (torch is
# already imported when the script starts), yet every command prints what plain bash prints --
# pipes, `$(...)`, `$PIPESTATUS`, stdin, stderr beside stdout, exit codes -- and what the
# stand-in cannot hand over (`python -c`) runs for real.
STAND_IN_COMMANDS = [
    'python p.py 2>/dev/null | sort; echo "rc ${PIPESTATUS[0]}"',
    "python p.py 3 2>&1; echo rc $?",
    "echo $(python p.py 2>/dev/null) done",
    "echo hi | python upper.py && python3 -c 'print(6 * 7)'",
    'minitron trace --wrld 16; echo "(exit code $?)"',
    "minitron groups --world 8 --tp 2 | head -3",
    "python -m json.tool <<< '{\"a\": 1}' && cat p.py | python upper.py | head -1",
]


def test_bash_commands_call_minitron_and_python_warm_and_print_what_bash_prints(tmp_path, warm_hook):
    (tmp_path / "p.py").write_text("import sys\nprint('b'); print('a'); print('oops', file=sys.stderr); print('c')\n"
                                   "sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)\n")
    (tmp_path / "upper.py").write_text("import sys\nprint(sys.stdin.read().upper(), end='')\n")
    (tmp_path / "warm.py").write_text("import sys\nprint('torch' in sys.modules)\n")
    (tmp_path / "calls.py").write_text("import subprocess\nsubprocess.run(['python', 'warm.py'], check=True)\n")
    hook = warm_hook
    hook._cache.clear()
    scratch = hook.scratch_dir(tmp_path)
    # `;` keeps it with bash; the script sees the warm runner's torch, not a fresh interpreter's.
    assert hook.execute("python warm.py; true", "page.md", tmp_path) == "True"
    # A script the runner runs warm (no bash) that calls `python` itself: the call is warm too.
    assert hook.command_run.warm.module.warm_plan("python calls.py", str(BIN))
    assert hook.execute("python calls.py", "page.md", tmp_path) == "True"
    for command in STAND_IN_COMMANDS:
        shown = hook.execute(command, "page.md", tmp_path)
        bash = subprocess.run(["bash", "-c", command], cwd=scratch, env=hook.command_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert shown == hook.clean(bash.stdout, hook.places(tmp_path)), command
    assert subprocess.run(["bash", "-c", "python warm.py"], cwd=scratch, env=hook.command_env(),
                          capture_output=True, text=True).stdout.strip() == "False"   # the control


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


def test_an_output_with_a_measured_time_says_so_under_it():
    """Two builds differ only in what they timed; a block that shows a time is labelled, so a
    page says which of its numbers are this build's measurements."""
    text = load_hook().page_text
    timed = text.fenced("rank 0\n└── pretrain  524.5 ms", "    ")
    assert timed[-1] == "    " + text.MEASURED_NOTE and timed[-2] == ""
    for steady in ("no debugger attached within 2 s", "16 ranks x 137 new_group calls", ""):
        assert text.MEASURED_NOTE not in "\n".join(text.fenced(steady, "")), steady
