"""`minitron ... --help` at a narrow terminal: lines break at spaces only, never inside a flag.

click wraps help text with Python's textwrap, which also breaks after a hyphen, so at 80
columns `--global-batch-size` became `--global-batch-` and `size` on the next line
(cli/command.py's help formatter stops that). Every command's help is rendered here at 80
columns, and at 50, where far more lines break.
"""

from __future__ import annotations

import re

import pytest
import typer

from cli_here import minitron_here

FLAG = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*")


def _commands(command, path=()):
    """(argv path, click command) for the group and every command under it."""
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


def _all_commands():
    from minitron.cli import app
    return list(_commands(typer.main.get_command(app)))


@pytest.mark.parametrize("columns", [80, 50])
def test_help_never_splits_a_flag(columns):
    checked = 0
    for path, command in _all_commands():
        done = minitron_here(*path, "--help", env={"COLUMNS": str(columns)})
        where = f"minitron {' '.join(path)} --help at {columns} columns"
        assert done.returncode == 0, f"{where}: {done.stderr}"
        help_text = done.stdout
        words = set(FLAG.findall(help_text))
        own = {o for p in command.params for o in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]}
        missing = sorted(o for o in own if o.startswith("-") and o not in words)
        assert not missing, f"{where}: flags not shown whole: {missing}\n{help_text}"
        # A line that ends in a letter and a hyphen was broken after the hyphen: whatever word
        # it was (Megatron's --global-batch-size, torchrun's --nproc-per-node), it is split.
        broken = [line for line in help_text.splitlines() if re.search(r"\w-$", line)]
        assert not broken, f"{where}: lines broken at a hyphen: {broken}"
        assert "\u2011" not in help_text, f"{where}: a non-breaking hyphen was left in the output"
        checked += 1
    assert checked >= 10   # the group and its commands: a listing that found none checked nothing
