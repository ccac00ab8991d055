"""Write VS Code's .vscode/launch.json: one "attach" per rank, plus one compound for them all.

The file belongs to the user as much as to us, so the merge is careful:

* ours carry a mark, ``"presentation": {"group": "minitron"}`` (a field VS Code itself reads:
  it groups them in the Run and Debug list), and only marked entries are ever replaced. A name
  is not a mark: a user's "minitron rank 0 (patched)" is the user's. Every other configuration
  and compound stays as it was, in order; one of the user's that has our exact name is an error;
* VS Code reads launch.json as JSONC (JSON with ``//`` and ``/* */`` comments and trailing
  commas), so we read it the same way; rewriting it drops comments and layout, so before any
  change the file is copied to a backup that no later run overwrites (``launch.json.bak``,
  then ``launch.json.bak.1``, ``.bak.2``, ...);
* a file we cannot read is left alone, with an error that says where it broke.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import minitron

NAME_PREFIX = "minitron rank "
COMPOUND_NAME = "minitron: all ranks"
MARK = {"group": "minitron"}  # under "presentation": what tells our entries from the user's
# The package the ranks import, and the folder above it (the checkout, for an editable install).
PACKAGE = Path(minitron.__file__).resolve().parent
CHECKOUT = PACKAGE.parent


def workspace_of(path) -> Path:
    """The folder VS Code opens for a launch.json: the one holding its ``.vscode/``; for a file
    written anywhere else (``--path``), the current folder, where the user runs the command."""
    path = Path(path).absolute()
    return path.parent.parent if path.parent.name == ".vscode" else Path.cwd()


def remote_root(workspace) -> str:
    """The ranks' side of pathMappings: where they import minitron from, spelt for launch.json.

    When the package sits in the workspace (an editable install of the checkout VS Code has
    open, the usual case), the answer is ``${workspaceFolder}`` or a folder under it: the file
    then holds no path of this machine, so it can be committed, shared, or shown on a page. A
    workspace whose ``minitron/`` is a link to the package counts too: debugpy matches
    breakpoints on the file's real path, links resolved. Anywhere else (site-packages, another
    checkout) VS Code has no variable for the folder, and only the absolute path will do.
    """
    workspace = Path(workspace).absolute()
    if (workspace / PACKAGE.name).resolve() == PACKAGE:
        return "${workspaceFolder}"
    try:
        inner = CHECKOUT.relative_to(workspace.resolve())
    except ValueError:
        return str(CHECKOUT)
    return "${workspaceFolder}/" + inner.as_posix()


def attach_configuration(rank: int, port: int, host: str, remote: str | None = None) -> dict:
    """What VS Code needs to attach to one rank's debugpy adapter (``remote``: remote_root's
    answer for the workspace; the absolute checkout when not given)."""
    return {
        "name": f"{NAME_PREFIX}{rank}",
        "type": "debugpy",             # the Python Debugger extension ("python" is its old name)
        "request": "attach",           # the rank is already running; we only connect to it
        "connect": {"host": host, "port": port},
        # The editor's side is the folder VS Code has open (the checkout, whose .vscode holds
        # this file), spelt as VS Code users expect and as it reads on anyone's machine; the
        # rank's side is where the ranks import minitron from (remote_root). On another node,
        # remoteRoot would be that node's checkout.
        "pathMappings": [{"localRoot": "${workspaceFolder}", "remoteRoot": remote or str(CHECKOUT)}],
        "justMyCode": False,           # step into minitron and torch.distributed, not only "your" code
        "presentation": {**MARK, "order": rank},  # our mark; VS Code lists them together, in rank order
    }


def strip_jsonc(text: str) -> tuple[str, bool]:
    """JSONC -> JSON: drop comments and trailing commas, never touching string contents.
    Returns the JSON text and whether any comment was found."""
    out: list[str] = []
    i, n, had_comment = 0, len(text), False
    while i < n:
        c = text[i]
        if c == '"':  # copy a whole string literal, escapes included
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            had_comment = True
            while i < n and text[i] != "\n":
                i += 1
        elif text.startswith("/*", i):
            had_comment = True
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            out.append(" ")
        else:
            if c in "}]":
                _drop_trailing_comma(out)
            out.append(c)
            i += 1
    return "".join(out), had_comment


def _drop_trailing_comma(out: list[str]) -> None:
    """Before a closing } or ]: remove a comma that only blanks (or removed comments) follow."""
    k = len(out) - 1
    while k >= 0 and out[k].isspace():
        k -= 1
    if k >= 0 and out[k] == ",":
        del out[k]


def read_launch_json(path: Path) -> tuple[dict, bool]:
    """The existing file as a dict (empty skeleton if absent) and whether it had comments."""
    if not path.exists():
        return {"version": "0.2.0", "configurations": []}, False
    if path.is_dir():
        raise ValueError(f"{path} is a directory; give --path a launch.json file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: byte {exc.start} is not UTF-8 text; it was left untouched: fix it, "
                         f"or write elsewhere with --path") from None
    if not text.strip():
        return {"version": "0.2.0", "configurations": []}, False
    cleaned, had_comment = strip_jsonc(text)
    try:
        data = json.loads(cleaned)
    except json.JSONDecodeError as exc:
        raise ValueError(f"cannot read {path} as JSON with comments ({exc.msg} near line {exc.lineno}); "
                         f"it was left untouched: fix it, or write elsewhere with --path") from None
    except RecursionError:  # Python's parser recurses per level; a launch.json has three or four
        raise ValueError(f"{path} is nested too deeply to be a launch.json; it was left untouched: fix it, "
                         f"or write elsewhere with --path") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object with "
                         f"\"configurations\"; it was left untouched: fix it or use --path")
    for key in ("configurations", "compounds"):
        if not isinstance(data.get(key, []), list):
            raise ValueError(f"{path}: \"{key}\" is not a list; it was left untouched: fix it or use --path")
        for number, entry in enumerate(data.get(key, [])):
            _check_entry(path, f"{key}[{number}]", entry)
    return data, had_comment


def _check_entry(path: Path, where: str, entry) -> None:
    """What the merge reads of an entry, as VS Code's schema has it: an object, its name a
    string. Anything else would surface as a TypeError halfway through the merge."""
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: {where} is a JSON {_kind(entry)}, not a configuration object; it was left "
                         f"untouched: fix it or use --path")
    if "name" in entry and not isinstance(entry["name"], str):
        raise ValueError(f"{path}: {where}.name is a JSON {_kind(entry['name'])}, not a string; it was left "
                         f"untouched: fix it or use --path")


def _kind(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


# What an earlier minitron wrote before it marked its entries: exactly these keys, our names.
_UNMARKED_KEYS = {"name", "type", "request", "connect", "pathMappings", "justMyCode"}


def _ours(entry) -> bool:
    if not isinstance(entry, dict):
        return False
    presentation = entry.get("presentation")
    if isinstance(presentation, dict) and presentation.get("group") == MARK["group"]:
        return True
    name = entry.get("name", "")
    legacy_rank = (set(entry) == _UNMARKED_KEYS and name.startswith(NAME_PREFIX)
                   and name[len(NAME_PREFIX):].isdigit() and entry.get("request") == "attach")
    legacy_compound = set(entry) == {"name", "configurations"} and name == COMPOUND_NAME
    return legacy_rank or legacy_compound


def _backup_path(path: Path) -> Path:
    """The first free name of launch.json.bak, .bak.1, .bak.2, ...: no backup is overwritten."""
    candidate, n = path.with_name(path.name + ".bak"), 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.bak.{n}")
    return candidate


def write_launch_json(path, world: int, port_base: int, host: str = "127.0.0.1") -> Path:
    """Write or merge ``path``: attach configurations for ranks 0..world-1 on host:port_base+R."""
    path = Path(path)
    if world < 1:
        raise ValueError(f"--world must be at least 1, got {world}")
    if not host.strip() or any(c.isspace() for c in host):
        raise ValueError(f"--debug-host {host!r} is not an address; use 127.0.0.1 (this machine only), or the "
                         f"address the ranks listen on")
    if not 1 <= port_base <= 65535 - (world - 1):
        raise ValueError(f"--debug-port-base {port_base}: ranks 0..{world - 1} need ports "
                         f"{port_base}..{port_base + world - 1}, which must lie within 1..65535")
    data, _ = read_launch_json(path)
    remote = remote_root(workspace_of(path))
    ours = [attach_configuration(r, port_base + r, host, remote) for r in range(world)]
    data.setdefault("version", "0.2.0")
    theirs = [c for c in data.get("configurations", []) if not _ours(c)]
    compound = {"name": COMPOUND_NAME, "configurations": [c["name"] for c in ours],
                "presentation": dict(MARK)}
    their_compounds = [c for c in data.get("compounds", []) if not _ours(c)]
    taken = {c.get("name") for c in theirs + their_compounds if isinstance(c, dict)}
    clash = sorted(taken & {c["name"] for c in ours + [compound]})
    if clash:
        raise ValueError(f"{path} already has {clash[0]!r}, which minitron did not write; it was left "
                         f"untouched: rename yours, or write elsewhere with --path")
    data["configurations"] = theirs + ours
    data["compounds"] = their_compounds + [compound]

    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=4) + "\n"
    if path.exists() and path.read_bytes().strip() and path.read_bytes() != text.encode("utf-8"):
        shutil.copyfile(path, _backup_path(path))  # comments and layout live on there
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # all or nothing: an interrupted write never leaves half a file
    return path
