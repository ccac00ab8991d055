"""docs/hooks/snippet_names.py: a chapter includes a definition by its name."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE = '''"""A module."""

import functools

# What the table is for,
# in two lines.
TABLE = (1, 2)
ROWS = 2  # right below it
# Its own comment.
COLUMNS = 3


@functools.lru_cache
def cached(x):
    return x


class Thing:
    def first(self):
        return 1

    @staticmethod
    def second():
        # --8<-- [start:inner]
        y = 2
        # --8<-- [end:inner]
        return y


def other():
    pass
'''


@pytest.fixture(scope="module")
def hook():
    spec = importlib.util.spec_from_file_location("snippet_names", ROOT / "docs/hooks/snippet_names.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lines_of(span):
    first, last = span
    return SOURCE.split("\n")[first - 1:last]


def test_functions_classes_methods_and_assignments_by_name(hook):
    assert lines_of(hook.definition_lines(SOURCE, "cached")) == [
        "@functools.lru_cache", "def cached(x):", "    return x"]  # decorators belong to it
    assert lines_of(hook.definition_lines(SOURCE, "Thing.first")) == [
        "    def first(self):", "        return 1"]
    assert lines_of(hook.definition_lines(SOURCE, "Thing"))[0] == "class Thing:"
    assert lines_of(hook.definition_lines(SOURCE, "Thing"))[-1] == "        return y"
    assert lines_of(hook.definition_lines(SOURCE, "TABLE")) == [
        "# What the table is for,", "# in two lines.", "TABLE = (1, 2)"]  # its comment explains it
    assert hook.definition_lines(SOURCE, "missing") is None
    assert hook.definition_lines(SOURCE, "Thing.missing") is None
    assert hook.definition_lines(SOURCE, "first") is None  # a method is named with its class


def test_page_lines_become_line_ranges_and_markers_still_win(hook, tmp_path):
    (tmp_path / "m.py").write_text(SOURCE)
    page = "\n".join(['```python', '--8<-- "m.py:cached,other"', '```',
                      '    --8<-- "m.py:Thing.second"', '--8<-- "m.py:inner"', '--8<-- "m.py:3:4"'])
    first, last = hook.definition_lines(SOURCE, "cached")
    o_first, o_last = hook.definition_lines(SOURCE, "other")
    s_first, s_last = hook.definition_lines(SOURCE, "Thing.second")
    assert hook.expand(page, "page.md", tmp_path).split("\n") == [
        '```python', f'--8<-- "m.py:{first}:{last}"', '', f'--8<-- "m.py:{o_first}:{o_last}"', '```',
        f'    --8<-- "m.py:{s_first}:{s_last}"',   # indentation kept (admonitions, tabs)
        '--8<-- "m.py:inner"',                      # a [start:inner] section: left to snippets
        '--8<-- "m.py:3:4"']                        # line ranges are snippets' own


def test_names_next_to_each_other_in_the_source_stay_one_block(hook, tmp_path):
    (tmp_path / "m.py").write_text(SOURCE)
    first, _ = hook.definition_lines(SOURCE, "TABLE")
    _, last = hook.definition_lines(SOURCE, "COLUMNS")
    assert SOURCE.split("\n")[first - 1:last] == [
        "# What the table is for,", "# in two lines.", "TABLE = (1, 2)", "ROWS = 2  # right below it",
        "# Its own comment.", "COLUMNS = 3"]
    assert hook.expand('--8<-- "m.py:TABLE,ROWS,COLUMNS"', "p.md", tmp_path) == f'--8<-- "m.py:{first}:{last}"'
    c_first, c_last = hook.definition_lines(SOURCE, "cached")  # two blank lines away: its own block
    assert hook.expand('--8<-- "m.py:COLUMNS,cached"', "p.md", tmp_path).split("\n") == [
        f'--8<-- "m.py:{last - 1}:{last}"', "", f'--8<-- "m.py:{c_first}:{c_last}"']


def test_a_name_that_names_nothing_fails_the_build_naming_the_page(hook, tmp_path):
    from mkdocs.exceptions import PluginError

    (tmp_path / "m.py").write_text(SOURCE)
    with pytest.raises(PluginError, match=r"ch\.md: m\.py has no .*'nothing_here'"):
        hook.expand('--8<-- "m.py:nothing_here"', "ch.md", tmp_path)
