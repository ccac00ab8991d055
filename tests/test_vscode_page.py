"""launch.json's remoteRoot: ${workspaceFolder} when the package sits in the project, the real
folder where VS Code needs one, and never a path of the build machine on chapter 2's page."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from minitron.launcher.vscode import CHECKOUT, PACKAGE, remote_root, workspace_of, write_launch_json
from test_docs import ROOT, load_hook

CHAPTER = ROOT / "walkthrough" / "02-debugging.md"


def test_the_package_in_the_workspace_is_spelt_with_workspacefolder(tmp_path):
    assert remote_root(CHECKOUT) == "${workspaceFolder}"                 # the checkout opened in VS Code
    assert remote_root(CHECKOUT.parent) == "${workspaceFolder}/" + CHECKOUT.name   # a project above it
    linked = tmp_path / "project"
    linked.mkdir()
    (linked / "minitron").symlink_to(PACKAGE)                            # debugpy resolves links
    assert remote_root(linked) == "${workspaceFolder}"


def test_a_package_elsewhere_keeps_its_absolute_folder(tmp_path):
    """VS Code has no variable for site-packages or another checkout: the file needs the path."""
    assert remote_root(tmp_path) == str(CHECKOUT)
    path = write_launch_json(tmp_path / ".vscode" / "launch.json", 1, 6000)
    mapping = json.loads(path.read_text())["configurations"][0]["pathMappings"][0]
    assert mapping == {"localRoot": "${workspaceFolder}", "remoteRoot": str(CHECKOUT)}


def test_the_workspace_is_the_folder_above_dot_vscode(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert workspace_of(tmp_path / "p" / ".vscode" / "launch.json") == tmp_path / "p"
    assert workspace_of(Path("elsewhere/launch.json")) == tmp_path     # --path anywhere: where it ran


def test_the_chapter_shows_no_machine_path_with_minitron_installed_elsewhere(tmp_path, monkeypatch):
    """Build the chapter's launch.json example as the site's build does, with the commands'
    minitron imported from a copy outside the checkout (PYTHONPATH wins over the editable install)."""
    command = re.search(r"<!-- run: (minitron vscode .*?) -->", CHAPTER.read_text()).group(1)
    elsewhere = tmp_path / "installed-elsewhere"
    shutil.copytree(ROOT / "minitron", elsewhere / "minitron", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("PYTHONPATH", str(elsewhere))
    hook = load_hook()
    try:
        shown = hook.expand(f"<!-- run: {command} -->", "walkthrough/02-debugging.md", ROOT)
        written = json.loads((hook.scratch_dir(ROOT) / "vscode" / "launch.json").read_text())
    finally:
        hook.on_post_build(None)
    # The user's file holds the folder the ranks really import from ...
    assert written["configurations"][0]["pathMappings"][0]["remoteRoot"] == str(elsewhere.resolve())
    # ... and the page the stated neutral form, with no folder of this machine anywhere.
    page = json.loads(shown.split("\n", 1)[1].rsplit("\n", 1)[0])
    assert page["configurations"][0]["pathMappings"][0]["remoteRoot"] == hook.CHECKOUT_SHOWN_AS
    for machine_path in (str(tmp_path), str(ROOT), str(Path.home()), str(elsewhere.resolve())):
        assert machine_path not in shown
