"""MkDocs hook: ``--8<-- "minitron/x.py:name"`` includes the definition called ``name``.

Why: a chapter shows a function by naming it, so the source needs no ``# --8<-- [start:...]``
marker lines around every function a chapter quotes. Those lines are noise to a reader of the
code, and they drift: a marker left behind a moved function silently quotes the wrong lines.
A name is checked on every build; the file's own syntax tree says where the definition is today.

What a name may be, in a ``.py`` file:

* a top-level function or class (``forward_step``, ``RankGenerator``), its decorators included;
* a method, as ``Class.method``;
* a top-level assignment (``GROUP_KINDS``), with the comment lines right above it, which
  explain it;
* several of those, comma-separated (``a,b``): each is included in turn, a blank line between,
  except where two follow each other in the source with nothing between them (a block of
  constants stays one block, as it reads there).

A section marker of the same name, if the file has one, wins: markers remain the way to quote
a few lines from *inside* a function. Names are turned into the line ranges pymdownx.snippets
already understands (``path:12:40``), so snippets still does the including, the dedenting
and the path checks; this hook only runs first (``on_page_markdown`` comes before Markdown is
converted, where snippets runs). A name that resolves to nothing fails the build, naming the
page and the reference.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

# A whole line that is one snippet reference to a .py file with a ":name" part. Names that
# start with a digit or are line ranges ("path:3:9") are not ours; snippets reads them itself.
SNIPPET_LINE = re.compile(
    r'^(?P<indent>[ \t]*)--8<--[ \t]+"(?P<path>[^":\n]+\.py):(?P<names>[A-Za-z_][\w.]*(?:,[A-Za-z_][\w.]*)*)"[ \t]*$')


def has_section(text: str, name: str) -> bool:
    """Does the file mark a snippets section of this name ([start:name] ... [end:name])?"""
    return re.search(rf"\[\s*start\s*:\s*{re.escape(name)}\s*\]", text) is not None


def _span(node: ast.AST, lines: list[str], with_comments: bool) -> tuple[int, int]:
    """1-based (first, last) line of a definition: decorators first, and for an assignment the
    comment lines directly above it."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    if with_comments:
        while first > 1 and lines[first - 2].lstrip().startswith("#"):
            first -= 1
    return first, node.end_lineno


def _assigned_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def definition_lines(text: str, name: str) -> tuple[int, int] | None:
    """Where definition ``name`` (``f``, ``C``, ``C.m`` or ``CONSTANT``) is in this source."""
    tree, lines = ast.parse(text), text.split("\n")
    body, parts = tree.body, name.split(".")
    for depth, part in enumerate(parts):
        found = None
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == part:
                found = node
            elif depth == 0 and len(parts) == 1 and part in _assigned_names(node):
                return _span(node, lines, with_comments=True)
        if found is None:
            return None
        if depth == len(parts) - 1:
            return _span(found, lines, with_comments=False)
        body = found.body
    return None


def resolve(root: Path, path: str, names: str) -> list[str] | None:
    """The snippet references that replace ``path:names``: None to leave it to snippets (a
    section marker of that name), else one ``path:first:last`` per name. Raises LookupError
    for a name that is neither."""
    text = (root / path).read_text(encoding="utf-8")
    if "," not in names and has_section(text, names):
        return None
    spans: list[list[int]] = []
    for name in names.split(","):
        span = definition_lines(text, name)
        if span is None:
            raise LookupError(f"{path} has no function, class, method or assignment {name!r} "
                              f"(and no [start:{name}] section)")
        if spans and span[0] == spans[-1][1] + 1:
            spans[-1][1] = span[1]  # right after the previous one: the same block
        else:
            spans.append(list(span))
    return [f"{path}:{first}:{last}" for first, last in spans]


def expand(markdown: str, page: str, root: Path) -> str:
    out = []
    for line in markdown.split("\n"):
        match = SNIPPET_LINE.match(line)
        if match is None or not (root / match["path"]).is_file():
            out.append(line)  # not ours, or a missing file: snippets' check_paths reports it
            continue
        try:
            refs = resolve(root, match["path"], match["names"])
        except LookupError as exc:
            raise PluginError(f"{page}: {exc}") from None
        if refs is None:
            out.append(line)
            continue
        for i, ref in enumerate(refs):
            if i:
                out.append("")  # a blank line between two definitions, as in the source
            out.append(f'{match["indent"]}--8<-- "{ref}"')
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):
    root = Path(config.config_file_path).parent
    return expand(markdown, page.file.src_uri, root)
