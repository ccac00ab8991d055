"""The architecture, read again from the code's imports.

minitron is built in floors: tracing on the ground, the devices and the launcher above it, then
communication, then DeepSpeed's ops (its optimizers), then the model with its parallelism (and
DeepSpeed's runtime beside it), then training, then the entry points, and the command line on
top. A floor may use any floor below it, never one above, and two packages on the same floor do
not use each other. These tests read every ``import`` statement of ``minitron/`` with ``ast``
(nothing is imported, torch least of all) and check three things:

* floors: no import runs up a floor (FLOORS below is the map, as data);
* no import cycle between minitron's modules, function-level imports counted: an import inside a
  function only delays a cycle, it does not remove it;
* every import inside a function says why it is there, in a comment on its line or in the
  comment lines directly above it (one comment may head a block of such imports);
* one place for each fact: no constant restated in a second module, no name declared twice in a
  class body, no function body repeated (see "one place for each fact" below).

Run ``python tests/test_architecture.py`` to print the module graph's findings without pytest.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "minitron"

# The floors, from the ground up. A module's floor is that of the longest package listed here
# that holds it (the package root holds only its own empty __init__). A module may import from
# its own package and from the floors below; packages that share a floor do not use each other.
FLOORS: list[tuple[str, list[str]]] = [
    ("the package root (empty: anything may import it)", ["minitron"]),
    ("ground: call tracing", ["minitron.trace"]),
    ("devices; the launcher (its parent stays cheap: no model, no training)",
     ["minitron.accelerator", "minitron.launcher"]),
    ("DeepSpeed's utils: the comms logger, to which every collective of comm reports",
     ["minitron.utils"]),
    ("communication (DeepSpeed's comm)", ["minitron.comm"]),
    ("DeepSpeed's ops: the optimizers its engine builds, in plain torch", ["minitron.ops"]),
    ("the model and its parallelism (Megatron core); DeepSpeed's runtime",
     ["minitron.core", "minitron.runtime"]),
    ("DeepSpeed's activation checkpoint (ZeRO-R): it recomputes Megatron's layers with their random "
     "streams, so it stands on both; its configure() installs it in the model (replace_checkpoint)",
     ["minitron.runtime.activation_checkpointing.checkpointing"]),
    ("training (Megatron's training/)", ["minitron.training"]),
    ("entry points: the rank's script, the data tools", ["minitron.pretrain_gpt", "minitron.tools"]),
    ("the hybrid model's entry point: GPT's with another model (it imports pretrain_gpt's data, "
     "step and loss, which Megatron's pretrain_hybrid repeats)", ["minitron.pretrain_hybrid"]),
    ("the views of a trace: tables, trees, SVG; the commands use them, they use no command",
     ["minitron.cli.views"]),
    ("the command line", ["minitron.cli"]),
    ("python -m minitron", ["minitron.__main__"]),
]

# ALLOW: known offenders, each waiting for a fix in a file its owner is changing this session
# (the fix for each is written beside it). An entry is (file, what, check): for "floors" and
# "cycles" `what` is the imported minitron module, for "why" the import statement's first line,
# for "facts" the name under which the file restates a fact. The list only shrinks
# (test_allow_list_is_current fails on an entry that matches nothing any more) and is meant to
# be empty.
ALLOW: list[tuple[str, str, str]] = [
    # DeepSpeed's PipelineModule defaults to its activation checkpoint, which minitron's stands on
    # Megatron's random streams (core/tensor_parallel/random). The fix: checkpointing takes the
    # tracker from the mpu that configure() is given, as DeepSpeed's does, and drops to floor 5.
    ("minitron/runtime/pipe/module.py", "minitron.runtime.activation_checkpointing.checkpointing", "floors"),
]


# --- reading the code -------------------------------------------------------------------------

@dataclass(frozen=True)
class Import:
    module: str          # the importing module, e.g. minitron.training.training
    path: str            # its file, relative to the checkout
    line: int            # first line of the statement
    end_line: int        # last line (a parenthesised import spans several)
    in_function: bool    # inside a def or lambda: runs when called, not when the module loads
    type_checking: bool  # under `if TYPE_CHECKING:`: never runs
    targets: tuple[str, ...]  # minitron modules it loads (empty for torch, os, ...)
    text: str            # the statement's first line, for messages


@lru_cache(maxsize=None)
def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: name -> (file, is a package's __init__)."""
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The minitron modules an import statement loads. `from a.b import c` loads a.b.c when c is
    a module, else a.b (whose __init__ then defines or re-exports c)."""
    known = modules()
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:  # relative: from .x import y, from .. import z
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                 for alias in node.names]
    return [name for name in names if name == PACKAGE or name.startswith(PACKAGE + ".")]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


# An import is a statement, and statements live only in these lists (a def's or class's body,
# an if's or try's branches, a handler's, a match case's): the walk for imports goes down them
# alone, not into the expressions that are most of a tree's nodes (a lambda's body is one).
_STATEMENT_LISTS = ("body", "orelse", "finalbody", "handlers", "cases")


def _statements(node: ast.AST):
    for name in _STATEMENT_LISTS:
        children = getattr(node, name, None)
        if isinstance(children, list):
            yield from children


@lru_cache(maxsize=None)
def imports() -> tuple[Import, ...]:
    found = []
    for module, (path, is_package) in modules().items():
        rel = str(path.relative_to(ROOT))
        lines = _lines(rel)

        def walk(node: ast.AST, in_function: bool, type_checking: bool) -> None:
            for child in _statements(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    found.append(Import(module, rel, child.lineno, child.end_lineno or child.lineno,
                                        in_function, type_checking,
                                        tuple(_targets(module, is_package, child)),
                                        lines[child.lineno - 1].strip()))
                    continue
                nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                guarded = isinstance(child, ast.If) and _is_type_checking(child.test)
                walk(child, in_function or nested, type_checking or guarded)

        walk(_tree(path), False, False)   # the tree _facts_of reads too: each file parsed once
    return tuple(found)


def floor_of(module: str) -> tuple[int, str]:
    """(floor number, the package that places it) for a minitron module."""
    best = (-1, "")
    for number, (_, packages) in enumerate(FLOORS):
        for package in packages:
            holds = module == package or (package != PACKAGE and module.startswith(package + "."))
            if holds and len(package) > len(best[1]):
                best = (number, package)
    return best


def allowed(path: str, what: str, check: str) -> bool:
    return (path, what, check) in ALLOW


# --- the floors ----------------------------------------------------------------------------------

def floor_offences() -> list[str]:
    found = []
    for imp in imports():
        floor, home = floor_of(imp.module)
        for target in imp.targets:
            target_floor, target_home = floor_of(target)
            if target_home == home or target_floor < floor or allowed(imp.path, target, "floors"):
                continue
            where = "a floor above" if target_floor > floor else "on the same floor"
            found.append(f"{imp.path}:{imp.line} imports {target}, {where}: {home} is floor {floor} "
                         f"({FLOORS[floor][0]}), {target_home} floor {target_floor} "
                         f"({FLOORS[target_floor][0]})")
    return found


def test_every_module_has_a_floor():
    unplaced = sorted(m for m in modules() if floor_of(m)[0] < 0)
    assert not unplaced, ("modules on no floor (add their package to FLOORS in "
                          "tests/test_architecture.py): " + ", ".join(unplaced))


def test_no_import_runs_up_a_floor():
    found = floor_offences()
    assert not found, ("imports that run up (or across) a floor; move the shared piece down to "
                       "the floor that needs it:\n" + "\n".join(found))


# --- no cycles ------------------------------------------------------------------------------------

def import_graph() -> dict[str, dict[str, Import]]:
    """module -> {module it loads: the first statement that loads it}. Loading a.b.c from outside
    package a.b also runs a.b's __init__ (and a's), so those count as loaded too; from inside the
    package they are already loading, and do not."""
    graph: dict[str, dict[str, Import]] = {m: {} for m in modules()}
    for imp in imports():
        if imp.type_checking:
            continue
        for target in imp.targets:
            if allowed(imp.path, target, "cycles"):
                continue
            parts = target.split(".")
            for depth in range(1, len(parts) + 1):
                loaded = ".".join(parts[:depth])
                is_ancestor = imp.module == loaded or imp.module.startswith(loaded + ".")
                if loaded != imp.module and (depth == len(parts) or not is_ancestor) and loaded in graph:
                    graph[imp.module].setdefault(loaded, imp)
    return graph


def strongly_connected(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the graph is small, but recursion depth is not ours to
    spend): the groups of modules that can each reach all the others."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


def _cycle_in(group: list[str], graph: dict[str, dict[str, Import]]) -> list[str]:
    """One concrete cycle through the group's first module (breadth-first, shortest)."""
    members = set(group)
    start = group[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return list(reversed(path)) + [start]
                if child in members and child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return group


def cycle_offences() -> list[str]:
    graph = import_graph()
    found = []
    for group in strongly_connected(graph):
        cycle = _cycle_in(group, graph)
        steps = []
        for a, b in zip(cycle, cycle[1:]):
            imp = graph[a][b]
            late = " (inside a function)" if imp.in_function else ""
            steps.append(f"    {imp.path}:{imp.line} {a} imports {b}{late}")
        found.append(f"{len(group)} modules in a cycle: {', '.join(group)}\n  for instance:\n"
                     + "\n".join(steps))
    return found


def test_no_import_cycles():
    found = cycle_offences()
    assert not found, ("import cycles (a function-level import only delays one); break each by "
                       "moving the piece both sides need down a floor:\n" + "\n".join(found))


# --- every late import says why --------------------------------------------------------------

_NOT_A_REASON = re.compile(r"noqa(:\s*[A-Z]+\d+(\s*,\s*[A-Z]+\d+)*)?|type:\s*ignore(\[[^\]]*\])?|"
                           r"pragma:[^#]*|pylint:[^#]*|isort:[^#]*|fmt:[^#]*", re.IGNORECASE)


def _says_why(comment: str) -> bool:
    """A comment that explains: two words or more once linters' markers are taken out."""
    return len(re.findall(r"[A-Za-z]{2,}", _NOT_A_REASON.sub("", comment))) >= 2


@lru_cache(maxsize=None)
def _lines(path: str) -> list[str]:
    return (ROOT / path).read_text().splitlines()


@lru_cache(maxsize=None)
def _comments(path: str) -> dict[int, str]:
    """line -> the text of the comment on it (tokenize: a # inside a string is no comment)."""
    found = {}
    source = (ROOT / path).read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string.lstrip("#").strip()
    return found


def _reason(imp: Import, block_starts: dict[tuple[str, int], int]) -> bool:
    comments = _comments(imp.path)
    if any(_says_why(comments.get(line, "")) for line in range(imp.line, imp.end_line + 1)):
        return True
    # The comment lines directly above the block of imports this one belongs to.
    lines = _lines(imp.path)
    line = block_starts.get((imp.path, imp.line), imp.line) - 1
    above = []
    while line >= 1 and lines[line - 1].strip().startswith("#"):
        above.append(comments.get(line, ""))
        line -= 1
    return _says_why(" ".join(above))


def _block_starts() -> dict[tuple[str, int], int]:
    """(file, line of an import) -> first line of the block of import statements it stands in:
    imports with nothing but blank lines between them (a blank line may part stdlib from ours)."""
    starts: dict[tuple[str, int], int] = {}
    ordered = sorted(imports(), key=lambda imp: (imp.path, imp.line))
    for previous, imp in zip((None, *ordered), ordered):
        between = []
        if previous is not None and previous.path == imp.path:
            between = _lines(imp.path)[previous.end_line:imp.line - 1]
        if previous is not None and previous.path == imp.path and not any(s.strip() for s in between):
            starts[(imp.path, imp.line)] = starts[(previous.path, previous.line)]
        else:
            starts[(imp.path, imp.line)] = imp.line
    return starts


def unexplained_late_imports() -> list[str]:
    starts = _block_starts()
    return [f"{imp.path}:{imp.line} {imp.text}" for imp in imports()
            if imp.in_function and not _reason(imp, starts) and not allowed(imp.path, imp.text, "why")]


def test_every_function_level_import_says_why():
    found = unexplained_late_imports()
    assert not found, (
        f"{len(found)} imports inside a function with no comment saying why. Write the reason on "
        "the line or in the comment lines directly above (e.g. \"# lazy: `minitron --help` imports "
        "this module, and torch is not needed there\"); where there is none, move the import to "
        "the top of the module:\n"
        + "\n".join(found))


# --- one place for each fact -------------------------------------------------------------------
# A fact written in two places drifts: one copy is changed, the other is not, and nothing says
# so. Three kinds can be recognised from the code alone:
# * a module-level constant (an UPPER_CASE name; a leading underscore does not count) bound to
#   the same literal under the same name in two modules; for a dict, one key with the same value
#   (a table of dtype sizes restated in part is still restated);
# * a name declared twice in one class body: in a dataclass the second silently replaces the
#   first, keeping the first one's place;
# * a function whose body, its docstring aside and its parameters renamed in order, repeats
#   another's. Only bodies of two statements or more: a one-line body is a delegation or a stub
#   (``return self.module(...)``, ``pass``), which says nothing twice.
# The first module in path order is taken as the fact's home; each other place is an offence.

_CONSTANT = re.compile(r"_?[A-Z][A-Z0-9_]*")


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@lru_cache(maxsize=None)
def _definitions(path: Path) -> tuple[list[ast.AST], list[ast.ClassDef]]:
    """(every def, every class) in the module, nested ones included: one walk of its statements
    (defs and classes are statements: no expression holds one)."""
    functions, classes = [], []
    pending = [_tree(path)]
    while pending:
        for node in _statements(pending.pop()):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append(node)
            elif isinstance(node, ast.ClassDef):
                classes.append(node)
            pending.append(node)
    return functions, classes


def _constant_bindings(tree: ast.Module):
    """(name, value node, line) for each module-level binding of an UPPER_CASE name, including
    each name of ``A, B = 1, 2``."""
    for node in tree.body:
        pairs = []
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                        and len(target.elts) == len(node.value.elts):
                    pairs += list(zip(target.elts, node.value.elts))
                else:
                    pairs.append((target, node.value))
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            pairs.append((node.target, node.value))
        for target, value in pairs:
            if isinstance(target, ast.Name) and _CONSTANT.fullmatch(target.id):
                yield target.id, value, node.lineno


def _facts_of(path: Path):
    """(fact key, what, line) for each constant and function body the module states; equal keys
    in two places are one fact written twice."""
    tree = _tree(path)
    for name, value, line in _constant_bindings(tree):
        try:
            literal = ast.literal_eval(value)
        except (ValueError, TypeError):
            continue   # computed: not a literal fact
        name = name.lstrip("_")
        items = literal.items() if isinstance(literal, dict) else [(None, literal)]
        for key, item in items:
            yield ("constant", name, repr(key), repr(item)), name, line, None
    for node in _definitions(path)[0]:
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        if len(body) >= 2:
            # Keyed by its shape, the kinds of its nodes in order: equal bodies have equal
            # shapes, and few shapes are shared, so only those bodies are dumped and compared
            # (_all_fact_offences), not all ~1,800 (ast.dump was most of this test's time).
            shape = tuple(type(n).__name__ for statement in body for n in ast.walk(statement))
            yield ("body", shape), node.name, node.lineno, (node, body)


def _declared_twice(path: Path):
    """(Class.name, line, first line) for each name a class body declares a second time."""
    for node in _definitions(path)[1]:
        first: dict[str, int] = {}
        for statement in node.body:
            if isinstance(statement, ast.AnnAssign):
                targets = [statement.target]
            elif isinstance(statement, ast.Assign):
                targets = statement.targets
            else:
                continue
            for target in targets:
                if isinstance(target, ast.Name):
                    if target.id in first:
                        yield f"{node.name}.{target.id}", statement.lineno, first[target.id]
                    first.setdefault(target.id, statement.lineno)


def _normalised(function, body) -> str:
    """The body's syntax tree with the parameters renamed _0, _1, ... in order."""
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    names += [a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None]
    renamed = {name: f"_{i}" for i, name in enumerate(names)}
    # Renamed in place and put back after the dump (a deep copy of every body cost seconds);
    # ast.dump leaves out line numbers, so only the names and the shape make the key.
    touched = [node for statement in body for node in ast.walk(statement)
               if isinstance(node, ast.Name) and node.id in renamed]
    for node in touched:
        node.id = renamed[node.id]
    try:
        return ast.dump(ast.Module(body=list(body), type_ignores=[]))
    finally:
        original = {new: name for name, new in renamed.items()}
        for node in touched:
            node.id = original[node.id]


@lru_cache(maxsize=None)
def _all_fact_offences() -> list[tuple[str, str, str]]:
    """(file, what, message) for each place that states a fact again, ALLOW not consulted."""
    places: dict[tuple, dict[tuple[str, int, str], tuple | None]] = {}
    found = set()
    for path, _ in modules().values():
        rel = str(path.relative_to(ROOT))
        for key, what, line, definition in _facts_of(path):
            places.setdefault(key, {})[(rel, line, what)] = definition
        for what, line, first in _declared_twice(path):
            found.add((rel, what, f"{rel}:{line} {what} declared again (first at line {first})"))
    for key, where in places.items():
        groups = [list(where)]
        if key[0] == "body" and len(where) > 1:   # one shape: the same body only if the same tree
            same: dict[str, list] = {}
            for place, (node, body) in where.items():
                same.setdefault(_normalised(node, body), []).append(place)
            groups = list(same.values())
        verb = "restates" if key[0] == "constant" else "repeats the body of"
        for group in groups:
            (home, home_line, home_what), *others = sorted(group)
            for rel, line, what in others:
                found.add((rel, what, f"{rel}:{line} {what} {verb} {home}:{home_line} {home_what}"))
    return sorted(found)


def fact_offences() -> list[str]:
    return [message for rel, what, message in _all_fact_offences() if not allowed(rel, what, "facts")]


def test_each_fact_has_one_place():
    found = fact_offences()
    assert not found, ("facts written twice: keep one place and import from it (a torch-free one if "
                       "the estimator needs the fact), or delete the second declaration:\n" + "\n".join(found))


def test_allow_list_is_current():
    """Every ALLOW entry still matches an import or a fact; fixed ones must leave the list."""
    live = {(imp.path, target) for imp in imports() for target in imp.targets}
    live |= {(imp.path, imp.text) for imp in imports() if imp.in_function}
    live_facts = {(rel, what) for rel, what, _ in _all_fact_offences()}
    stale = [entry for entry in ALLOW
             if entry[2] not in ("floors", "cycles", "why", "facts")
             or entry[:2] not in (live_facts if entry[2] == "facts" else live)]
    assert not stale, ("ALLOW entries in tests/test_architecture.py that match no import or fact any more "
                       "(delete them):\n" + "\n".join(map(repr, stale)))


@contextmanager
def _reading(tmp_path, monkeypatch, files: dict[str, str]):
    """The checks pointed at a made-up package (file name -> text) for the with block."""
    for name, text in files.items():
        (tmp_path / PACKAGE / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / PACKAGE / name).write_text(text)
    caches = (modules, imports, _lines, _comments, _tree, _definitions, _all_fact_offences)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for cache in caches:
        cache.cache_clear()
    try:
        yield
    finally:
        for cache in caches:
            cache.cache_clear()


def test_the_checks_find_what_they_look_for(tmp_path, monkeypatch):
    """The three checks, run on a made-up package with one offence of each kind."""
    files = {
        "__init__.py": "",
        "trace/__init__.py": "def start():\n    from minitron.training import a\n",
        "training/__init__.py": "",
        "training/a.py": "from minitron.training import b\n",
        "training/b.py": ("def late():\n"
                          "    # a reason, directly above\n"
                          "    import json\n"
                          "    from minitron.training import a\n"),
        "widgets/__init__.py": "",
    }
    with _reading(tmp_path, monkeypatch, files):
        assert [line.split(" imports")[0] for line in floor_offences()] == ["minitron/trace/__init__.py:2"]
        cycles = cycle_offences()
        assert len(cycles) == 1 and "minitron.training.a, minitron.training.b" in cycles[0], cycles
        assert "minitron/training/b.py:4 minitron.training.b imports minitron.training.a (inside a function)" \
            in cycles[0], cycles[0]
        # json and its neighbour share the comment above the block; trace's import has none.
        assert unexplained_late_imports() == ["minitron/trace/__init__.py:2 from minitron.training import a"]
        assert [m for m in modules() if floor_of(m)[0] < 0] == ["minitron.widgets"]


def test_the_fact_check_finds_each_kind(tmp_path, monkeypatch):
    """The one-place rule on a made-up package holding this tree's old duplicates, in small: the
    buffer's alignments (one module binds them as a pair), a dtype table restated in part, a
    dataclass field declared twice, a function body under another name; and what must pass."""
    files = {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/buffer.py": ("_PARAM_START_ALIGN = 64\n_BUCKET_END_ALIGN = 128\nWIDTH = 80\n"
                           "def _pad(number, divisor):\n    blocks = -(-number // divisor)\n    return blocks * divisor\n"
                           "def forward(self, *a):\n    return self.module(*a)\n"),
        "core/config.py": ("from dataclasses import dataclass\n@dataclass\nclass Config:\n"
                           "    hook: int = 0\n    size: int = 1\n    hook: int = 0\n"),
        "training/__init__.py": "",
        "training/estimate.py": ("_PARAM_START_ALIGN, _BUCKET_END_ALIGN = 64, 128\n"
                                 "DTYPE_BYTES = {'float32': 4, 'bfloat16': 2}\nWIDTH = 100\nLIMIT = 2 ** 10\n"
                                 "def round_up(n, k):\n    \"\"\"A docstring does not make it new.\"\"\"\n"
                                 "    blocks = -(-n // k)\n    return blocks * k\n"
                                 "def forward(self, *args):\n    return self.module(*args)\n"),
        "cli/__init__.py": "",
        "cli/diff.py": "DTYPE_BYTES = {'float64': 8, 'float32': 4}\nLIMIT = 1024\n",
    }
    with _reading(tmp_path, monkeypatch, files):
        # Not offences: WIDTH (another value), LIMIT (computed in one place), forward (one line).
        assert fact_offences() == [
            "minitron/core/config.py:6 Config.hook declared again (first at line 4)",
            "minitron/training/estimate.py:1 BUCKET_END_ALIGN restates minitron/core/buffer.py:2 BUCKET_END_ALIGN",
            "minitron/training/estimate.py:2 DTYPE_BYTES restates minitron/cli/diff.py:1 DTYPE_BYTES",
            "minitron/training/estimate.py:1 PARAM_START_ALIGN restates minitron/core/buffer.py:1 PARAM_START_ALIGN",
            "minitron/training/estimate.py:5 round_up repeats the body of minitron/core/buffer.py:4 _pad",
        ]


if __name__ == "__main__":
    for title, found in (("floors", floor_offences()), ("cycles", cycle_offences()),
                         ("late imports without a reason", unexplained_late_imports()),
                         ("facts written twice", fact_offences())):
        print(f"== {title}: {len(found)}")
        print("\n".join(found))
    sys.exit(0)
