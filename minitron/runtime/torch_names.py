"""The names a torch module exports, read from its source without importing torch.

A ds_config may name any torch.optim optimizer or torch.optim.lr_scheduler schedule, as
DeepSpeed looks them up by name. Most configs that name one are checked by building it once
(which needs torch), but a name torch does not have at all (a misspelling such as "sgd") must
be refused as every bad input is: in one line, before torch is imported (an import costs a
second; the refusal a fraction of that). So the name is first looked for in the module's
``__all__`` as the installed torch's own source file writes it: the installed version's list,
not a copy that drifts.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path


@functools.cache
def exported(module: str) -> frozenset[str]:
    """``module``'s ``__all__`` (e.g. "torch.optim"), as its source file assigns it; empty when
    the file cannot be found or read that way (then callers fall back to importing)."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)   # finds torch without importing it
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    base = Path(spec.submodule_search_locations[0]).joinpath(*rest.split(".")) if rest else \
        Path(spec.submodule_search_locations[0])
    source = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    try:
        tree = ast.parse(source.read_text())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return frozenset(ast.literal_eval(node.value))
            except ValueError:   # built by code, not a literal list
                return frozenset()
    return frozenset()


def may_be_exported(module: str, name: str) -> bool:
    """False only when ``module``'s source says for certain that it has no ``name``."""
    names = exported(module)
    return not names or name in names


def spelled_as(module: str, name: str) -> str | None:
    """The name ``module`` exports that differs from ``name`` in case only ("SGD" for "sgd")."""
    return next((n for n in sorted(exported(module)) if n.lower() == name.lower() and n != name), None)
