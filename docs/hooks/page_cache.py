"""The outputs of a page's commands, kept with the sources (used by run_commands.py).

Why: running every page's commands costs a minute and a half of a core, most builds (a prose
edit, `mkdocs serve`, every test run) run the same commands on the same code, and the suite's
budget (issue 35) is spent by a fresh clone's first `pytest`. So the outputs of a page are kept
in ``docs/page-outputs/``, committed with the code that printed them, under a key that changes
whenever anything they could depend on does:

* the page's commands, all of them in page order: a command may read what an earlier one on
  the same page wrote, so a page's outputs are kept, and reused, together or not at all;
* every file of the sources the commands run: the ``minitron`` package, ``scripts/``,
  ``docs/examples/``, these hooks, ``pyproject.toml``, and any other file of the checkout a
  command names (``tests/dap_client.py``); their contents, not their dates;
* what the build tells the commands: the column width, and the interpreter, torch and CPU
  count they run with.

A page whose key is found is not run at all; a page whose key is not (its commands or any
source changed, or another torch) runs its commands, and the build writes their outputs there
and removes the entries no page asked for: after a change to the code, the build leaves the
new outputs in ``git status``, to commit with the change. A stale folder costs time, never
correctness: what does not match is run. Set ``MINITRON_DOCS_CACHE=0`` to run everything
(.ci/run does, once, so that every command is run against the code of every landing).

One input is left out of the key: SOURCE_DATE_EPOCH, the time the training log prints (the
time of the last commit of the code). Committing changes it without changing the code, and a
key holding it would throw the whole cache away at every commit. The entry records the time
it ran with instead, and ``load`` writes the build's own time over it: the time is printed in
one format, by minitron/training/training_log.py's log_time, so the output is exactly what
running the command again would print.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import subprocess
import time
from importlib import metadata
from pathlib import Path

FOLDER = Path("docs") / "page-outputs"
SOURCES = ("minitron", "scripts", "docs/examples", "docs/hooks", "pyproject.toml")


def enabled() -> bool:
    return os.environ.get("MINITRON_DOCS_CACHE", "1") != "0"


def checkout_files(root: Path) -> list[str]:
    """The checkout's files as a clone would have them (tracked, or new and not ignored)."""
    done = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True)
    if done.returncode == 0:
        return sorted(set(path for path in done.stdout.decode().split("\0") if path))
    found = []  # no git: every file but hidden folders (.venv, .cache) and build output
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in ("site", "__pycache__")]
        found += [str(Path(folder, name).relative_to(root)) for name in names]
    return sorted(found)


def sources_digest(root: Path, files: list[str], context: dict[str, str]) -> str:
    """One hash of the sources every page's commands run, and of what the build tells them."""
    digest = hashlib.sha256(json.dumps(sorted(context.items())).encode())
    for path in files:
        if path.startswith(tuple(f"{s}/" for s in SOURCES)) or path in SOURCES:
            _add_file(digest, root, path)
    return digest.hexdigest()


def environment() -> dict[str, str]:
    """What, besides the sources, makes a command print something else."""
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "none"
    return {"python": platform.python_version(), "torch": torch, "cpus": str(os.cpu_count())}


def page_key(root: Path, digest: str, files: set[str], commands: list[str]) -> str:
    key = hashlib.sha256(digest.encode())
    for command in commands:
        key.update(b"\0command\0" + command.encode())
        for path in sorted(_named_files(command, files)):
            _add_file(key, root, path)
    return key.hexdigest()


def load(root: Path, key: str, epoch: str = "") -> list[str] | None:
    """The outputs kept under ``key``, at the time ``epoch`` (see the module docstring)."""
    try:
        entry = json.loads((root / FOLDER / f"{key}.json").read_text())
        outputs = entry["outputs"]
    except (OSError, ValueError, KeyError):
        return None
    then, now = log_time(entry.get("epoch", "")), log_time(epoch)
    if then and now and then != now:
        outputs = [output.replace(then, now) for output in outputs]
    return outputs


def store(root: Path, key: str, page: str, commands: list[str], outputs: list[str], epoch: str = "") -> None:
    folder = root / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{key}.{os.getpid()}.tmp"
    entry = {"page": page, "commands": commands, "epoch": epoch, "outputs": outputs}
    temporary.write_text(json.dumps(entry))
    os.replace(temporary, folder / f"{key}.json")  # whole or not at all, even if builds overlap


def log_time(epoch: str) -> str:
    """SOURCE_DATE_EPOCH as the training log prints it (training_log.log_time's format)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(epoch))) if epoch.isdigit() else ""


def prune(root: Path, used: set[str]) -> None:
    """Forget the outputs no page of this build asked for (older code, removed pages)."""
    folder = root / FOLDER
    if folder.is_dir():
        for entry in folder.glob("*.json"):
            if entry.stem not in used:
                entry.unlink(missing_ok=True)


def _named_files(command: str, files: set[str]) -> set[str]:
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return {word for word in words if word in files}


def _add_file(digest, root: Path, path: str) -> None:
    digest.update(b"\0file\0" + path.encode() + b"\0")
    try:
        digest.update((root / path).read_bytes())
    except OSError:
        digest.update(b"(unreadable)")
