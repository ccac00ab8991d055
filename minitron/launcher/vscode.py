"""Write VS Code's .vscode/launch.json: one "attach" per rank, plus one compound for them all.

The file belongs to the user as much as to us, so the merge is careful:

* ours are recognised by name (``minitron rank N`` and ``minitron: all ranks``) and only those
  are replaced; every other configuration and compound stays as it was, in order;
* VS Code reads launch.json as JSONC (JSON with ``//`` and ``/* */`` comments and trailing
  commas), so we read it the same way; rewriting it drops the comments, so a file that had any
  is first copied to ``launch.json.bak``;
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
# The checkout the ranks run from: minitron's package folder's parent.
CHECKOUT = Path(minitron.__file__).resolve().parent.parent


def attach_configuration(rank: int, port: int, host: str) -> dict:
    """What VS Code needs to attach to one rank's debugpy adapter."""
    return {
        "name": f"{NAME_PREFIX}{rank}",
        "type": "debugpy",             # the Python Debugger extension ("python" is its old name)
        "request": "attach",           # the rank is already running; we only connect to it
        "connect": {"host": host, "port": port},
        # The ranks run on this machine from this checkout, so a file has the same path on
        # both sides. On another node, remoteRoot would be that node's checkout.
        "pathMappings": [{"localRoot": str(CHECKOUT), "remoteRoot": str(CHECKOUT)}],
        "justMyCode": False,           # step into minitron and torch.distributed, not only "your" code
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
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        return {"version": "0.2.0", "configurations": []}, False
    cleaned, had_comment = strip_jsonc(text)
    try:
        data = json.loads(cleaned)
    except json.JSONDecodeError as exc:
        raise ValueError(f"cannot read {path} as JSON with comments ({exc.msg} near line {exc.lineno}); "
                         f"it was left untouched: fix it, or write elsewhere with --path") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object with "
                         f"\"configurations\"; it was left untouched: fix it or use --path")
    for key in ("configurations", "compounds"):
        if not isinstance(data.get(key, []), list):
            raise ValueError(f"{path}: \"{key}\" is not a list; it was left untouched: fix it or use --path")
    return data, had_comment


def _ours(entry) -> bool:
    name = entry.get("name", "") if isinstance(entry, dict) else ""
    return name.startswith(NAME_PREFIX) or name == COMPOUND_NAME


# --8<-- [start:write]
def write_launch_json(path, world: int, port_base: int, host: str = "127.0.0.1") -> Path:
    """Write or merge ``path``: attach configurations for ranks 0..world-1 on host:port_base+R."""
    path = Path(path)
    if world < 1:
        raise ValueError(f"--world must be at least 1, got {world}")
    if not 1 <= port_base <= 65535 - (world - 1):
        raise ValueError(f"--debug-port-base {port_base}: ranks 0..{world - 1} need ports "
                         f"{port_base}..{port_base + world - 1}, which must lie within 1..65535")
    data, had_comment = read_launch_json(path)
    ours = [attach_configuration(r, port_base + r, host) for r in range(world)]
    data.setdefault("version", "0.2.0")
    data["configurations"] = [c for c in data.get("configurations", []) if not _ours(c)] + ours
    compound = {"name": COMPOUND_NAME, "configurations": [c["name"] for c in ours]}
    data["compounds"] = [c for c in data.get("compounds", []) if not _ours(c)] + [compound]

    path.parent.mkdir(parents=True, exist_ok=True)
    if had_comment:
        shutil.copyfile(path, path.with_name(path.name + ".bak"))  # the comments live on there
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # all or nothing: an interrupted write never leaves half a file
    return path
# --8<-- [end:write]
