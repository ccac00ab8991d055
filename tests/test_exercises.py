"""Every chapter's exercises: each answer is what its command prints today.

A chapter ends with "## Exercises": a question to predict, then a collapsed answer,

    ??? answer
        **the answer, as the command prints it**

        ```bash
        the one command that shows it
        ```

        why it is so.

This file reads the exercises out of the chapters, so a new exercise is checked without being
listed here: every ``**bold**`` span of an answer must appear in its command's output (spaces
folded, backticks dropped), and every chapter has two or three exercises. The commands run as
a reader runs them, from the repository root, but in this process where they can: ``minitron
...`` through the CLI's main(), ``python FILE ...`` as ``__main__``. This process has torch loaded
already, so a check costs what the command computes, not a fresh interpreter's import (on the
busy 2-core machine, 2 to 20 s each). So do ``python -c CODE``, a call that ends in ``; echo
"exit code $?"`` (its exit code is printed after it) and a call piped into ``grep`` (grep reads
what the call printed here). Anything else with shell syntax runs through bash.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from test_docs import load_hook   # the build hooks, loaded from their files as the docs tests load them

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ANSWER = re.compile(r"^\?\?\? answer\b")
BOLD = re.compile(r"\*\*(.+?)\*\*")
SHELL = set("|&;<>$`")


def exercises(page: Path) -> list[tuple[str, str, list[str]]]:
    """(question, command, expected strings) for each answer block of the page's Exercises."""
    text = page.read_text()
    if "\n## Exercises\n" not in text:
        return []
    lines = text.split("\n## Exercises\n", 1)[1].split("\n")
    found, question = [], []
    i = 0
    while i < len(lines):
        if not ANSWER.match(lines[i]):
            question.append(lines[i])
            i += 1
            continue
        body = []
        i += 1
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith("    ")):
            body.append(lines[i][4:])
            i += 1
        fence = "\n".join(body).split("```bash\n", 1)
        assert len(fence) == 2, f"{page.name}: an answer without a ```bash command"
        # A long command is folded with " \\" at line ends (to fit the page), as a shell joins it.
        command = re.sub(r" \\\n\s+", " ", fence[1].split("\n```", 1)[0].strip())
        expected = [" ".join(b.replace("`", "").split()) for b in BOLD.findall("\n".join(body))]
        assert expected, f"{page.name}: an answer without a **bold** result: {command}"
        found.append((" ".join(" ".join(question).split()), command, expected))
        question = []
    return found


def all_exercises() -> list:
    return [pytest.param(command, expected, id=f"{page.stem.split('-')[0]}-{n}")
            for page in sorted((ROOT / "walkthrough").glob("[0-9][0-9]*-*.md"))
            for n, (_, command, expected) in enumerate(exercises(page), 1)]


_seen: dict[str, str] = {}  # command -> output: two answers from one command run it once


def output_of(command: str, monkeypatch) -> str:
    """What the reader sees, stdout and stderr together (a refusal is an answer too)."""
    if command not in _seen:
        monkeypatch.chdir(ROOT)
        for name, value in (("COLUMNS", "80"), ("NO_COLOR", "1")):
            monkeypatch.setenv(name, value)
        # Two shell forms the chapters use run here too (each costs a fresh interpreter's
        # `import torch` in bash): a call that ends in `; echo "exit code $?"`, and a call
        # piped into grep (the call runs here, grep filters what it printed).
        call, shown_code, grep = command, False, None
        if call.endswith(EXIT_CODE):
            call, shown_code = call[:-len(EXIT_CODE)], True
        if " | grep " in call:
            call, grep = call.split(" | grep ", 1)
        words = shlex.split(call)
        bare, bare_grep = outside_quotes(call), outside_quotes(grep or "")
        if bare is None or bare_grep is None or SHELL & set(bare + bare_grep) \
                or words[0] not in ("minitron", "python"):
            _seen[command] = _in_bash(command)
            return _seen[command]
        if words[0] == "minitron":
            output, code = _in_app(words[1:], monkeypatch)
        elif words[1] == "-c" and len(words) == 3:
            output, code = _captured(lambda: exec(compile(words[2], "<string>", "exec"), {"__name__": "__main__"}),
                                     ["-c"], monkeypatch)
        else:
            output, code = _in_script(words[1], words[2:], monkeypatch)
        if grep:
            output = subprocess.run(["grep", *shlex.split(grep)], input=output, capture_output=True, text=True).stdout
        _seen[command] = output + (f"exit code {code}\n" if shown_code else "")
    return _seen[command]


EXIT_CODE = '; echo "exit code $?"'
# The docs build's rule for what lies outside quotes (a `;` inside ``python -c "..."`` is Python's;
# None: an escape or an open quote, left to bash), from its warm runner.
outside_quotes = load_hook("warm_runner").outside_quotes


def _in_app(args: list[str], monkeypatch) -> tuple[str, int]:
    """The CLI's entry point in this process: the torch and minitron it needs are loaded already
    (ranks it starts are forked from here, as tests/test_svg.py's traced run is). main(), not
    the typer app alone, because main() is what turns bad input into its one line."""
    from minitron.cli import main  # the command line's own entry point, refusals included

    return _captured(main, ["minitron", *args], monkeypatch)


def _in_script(path: str, args: list[str], monkeypatch) -> tuple[str, int]:
    """A docs/examples or scripts/ file run as __main__ in this process, which has already paid
    for importing torch: under a busy machine that import alone was most of each check."""
    return _captured(lambda: runpy.run_path(str(ROOT / path), run_name="__main__"), [path, *args], monkeypatch)


def _captured(run, argv: list[str], monkeypatch) -> tuple[str, int]:
    """(what ``run`` printed, its exit code as the shell's $? would say)."""
    monkeypatch.setattr(sys, "argv", argv)
    out, code = io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            run()
        except SystemExit as stop:  # an exit is the command's answer, not the test's end
            if stop.code not in (None, 0, 2):
                print(stop.code)
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    return out.getvalue(), code


def _in_bash(command: str) -> str:
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
    return done.stdout + done.stderr


@pytest.mark.parametrize("command,expected", all_exercises())
def test_answer_is_what_the_command_prints(command, expected, monkeypatch):
    shown = " ".join(output_of(command, monkeypatch).replace("`", "").split())
    for answer in expected:
        assert answer in shown, f"{answer!r} not in the output of {command}:\n{shown[-2000:]}"


def test_every_chapter_has_two_or_three_exercises():
    for page in sorted((ROOT / "walkthrough").glob("[0-9][0-9]*-*.md")):
        assert 2 <= len(exercises(page)) <= 3, f"{page.name}: {len(exercises(page))} exercises"


def test_the_parser_finds_question_command_and_answer(tmp_path):
    page = tmp_path / "99-x.md"
    page.write_text("# x\n\n## Exercises\n\n**1.** Which?\n\n??? answer\n    **A=[0,1]** and **2**\n\n"
                    "    ```bash\n    minitron groups --world 2 --tp 2\n    ```\n\n    Because.\n")
    assert exercises(page) == [("**1.** Which?", "minitron groups --world 2 --tp 2", ["A=[0,1]", "2"])]
