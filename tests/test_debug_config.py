"""--debug's checks, the rank-side settings, the console line, and launch.json merging.

No rank starts here: these are the parts that must be right before one does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minitron.launcher import debug
from minitron.launcher.debug import debug_env, parse_ranks, settings_from_env
from minitron.launcher.vscode import CHECKOUT, COMPOUND_NAME, strip_jsonc, write_launch_json

HERE = Path(__file__).parent


# -- the request ------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, ranks", [("3", [3]), ("0,2", [0, 2]), (" 2, 0 ,2", [0, 2]),
                                         ("all", [0, 1, 2, 3]), ("ALL", [0, 1, 2, 3]), ("1-3", [1, 2, 3])])
def test_rank_specs(spec, ranks):
    assert parse_ranks(spec, 4) == ranks


@pytest.mark.parametrize("spec, words", [
    ("4", ["rank 4", "world of 4", "0..3"]),
    ("-1", ["'-1'"]),
    ("one", ["'one'", "3, 0,2"]),
    ("0,,1", ["'0,,1'"]),
    ("3-1", ["low to high", "1-3"]),
    ("", ["''"]),
])
def test_bad_rank_specs_say_what_is_wrong(spec, words):
    with pytest.raises(ValueError) as exc:
        debug_env(spec, 4, 5678, "127.0.0.1", 600)
    assert all(w in str(exc.value) for w in words), str(exc.value)


def test_ports_and_timeout_are_checked():
    with pytest.raises(ValueError, match="rank 3 would listen on port 65536"):
        debug_env("all", 4, 65533, "127.0.0.1", 600)
    assert debug_env("3", 4, 65532, "127.0.0.1", 600)[debug.PORT_BASE_ENV] == "65532"
    with pytest.raises(ValueError, match="not a TCP port"):
        debug_env("0", 4, 0, "127.0.0.1", 600)
    with pytest.raises(ValueError, match="above 0"):
        debug_env("0", 4, 5678, "127.0.0.1", 0)
    with pytest.raises(ValueError, match="empty"):
        debug_env("0", 4, 5678, " ", 600)


def test_the_environment_round_trips_to_the_ranks(monkeypatch):
    env = debug_env("0,2", 4, 6000, "127.0.0.1", 2.5)
    assert env == {"MINITRON_DEBUG_RANKS": "0,2", "MINITRON_DEBUG_PORT_BASE": "6000",
                   "MINITRON_DEBUG_HOST": "127.0.0.1", "MINITRON_DEBUG_WAIT_TIMEOUT": "2.5"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert settings_from_env(4) == ([0, 2], 6000, "127.0.0.1", 2.5)
    # Under torchrun only the ranks variable is needed; the rest have defaults.
    for key in (debug.PORT_BASE_ENV, debug.HOST_ENV, debug.WAIT_TIMEOUT_ENV):
        monkeypatch.delenv(key)
    monkeypatch.setenv(debug.RANKS_ENV, "all")
    assert settings_from_env(2) == ([0, 1], 5678, "127.0.0.1", 600.0)


def test_a_bad_environment_ends_the_rank_with_one_line(monkeypatch, capfd):
    monkeypatch.setattr(debug, "_asked_in_pid", None)
    monkeypatch.setenv(debug.RANKS_ENV, "5")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exc:
        debug.wait_for_debugger_if_asked(0)
    assert exc.value.code == 2
    assert capfd.readouterr().err == ("rank 0: --debug '5': rank 5 is not in this world of 2; "
                                      "choose ranks 0..1\n")


def test_ranks_not_asked_never_load_the_debugger():
    """Rank 0 of a '--debug 1' job returns at once, without importing debugpy."""
    code = ("import os, sys; os.environ.update(MINITRON_DEBUG_RANKS='1', WORLD_SIZE='2');"
            "from minitron.launcher import debug; debug.wait_for_debugger_if_asked(0);"
            "print('debugpy' in sys.modules, 'pydevd' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_waiting_line_reaches_the_launchers_terminal_and_the_log(monkeypatch, capfd):
    read, write = os.pipe()
    try:
        monkeypatch.setenv(debug.CONSOLE_FD_ENV, str(write))
        debug.say("rank 3: waiting for a debugger on 127.0.0.1:5681")
        os.close(write)
        write = None
        assert os.read(read, 1000) == b"rank 3: waiting for a debugger on 127.0.0.1:5681\n"
        assert capfd.readouterr().err == "rank 3: waiting for a debugger on 127.0.0.1:5681\n"
    finally:
        os.close(read)
        if write is not None:
            os.close(write)


def test_cli_rejects_a_bad_request_before_any_rank_starts():
    out = subprocess.run([sys.executable, "-m", "minitron", "launch", "--world", "2", "--backend", "gloo",
                          "--debug", "2", str(HERE / "_rank_probe.py")], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "minitron: error: --debug '2': rank 2 is not in this world of 2; choose ranks 0..1"]


# -- launch.json ------------------------------------------------------------------------------
def ours(data: dict) -> list[dict]:
    return [c for c in data["configurations"] if c["name"].startswith("minitron rank ")]


def test_a_fresh_launch_json(tmp_path):
    path = write_launch_json(tmp_path / ".vscode" / "launch.json", 3, 6000, "127.0.0.1")
    data = json.loads(path.read_text())
    assert [(c["name"], c["connect"]["port"]) for c in data["configurations"]] == [
        ("minitron rank 0", 6000), ("minitron rank 1", 6001), ("minitron rank 2", 6002)]
    for config in data["configurations"]:
        assert (config["type"], config["request"], config["justMyCode"]) == ("debugpy", "attach", False)
        assert config["connect"]["host"] == "127.0.0.1"
        # The editor's side as VS Code users write it; the ranks' side where they import minitron.
        assert config["pathMappings"] == [{"localRoot": "${workspaceFolder}", "remoteRoot": str(CHECKOUT)}]
    assert (CHECKOUT / "minitron" / "core" / "parallel_state.py").is_file()  # the right root
    assert data["compounds"] == [{"name": COMPOUND_NAME, "configurations": [
        "minitron rank 0", "minitron rank 1", "minitron rank 2"], "presentation": {"group": "minitron"}}]


USER_FILE = """{
    // my own configurations
    "version": "0.2.0",
    "configurations": [
        {
            "name": "Python: current file",   /* keep me */
            "type": "debugpy",
            "request": "launch",
            "program": "${file}",
            "args": ["--url", "http://example.com/a,]"],
        },
        {"name": "minitron rank 7", "type": "debugpy", "request": "attach",
         "connect": {"host": "127.0.0.1", "port": 1}},
    ],
    "compounds": [
        {"name": "mine", "configurations": ["Python: current file"]},
        {"name": "minitron: all ranks", "configurations": ["minitron rank 7"]},
    ],
}
"""


def test_merging_keeps_the_users_entries_and_replaces_ours(tmp_path):
    path = tmp_path / "launch.json"
    path.write_text(USER_FILE)
    write_launch_json(path, 2, 5678, "127.0.0.1")
    data = json.loads(path.read_text())
    user = data["configurations"][0]
    assert user["name"] == "Python: current file"
    assert user["args"] == ["--url", "http://example.com/a,]"]  # strings survive comma cleanup
    # "minitron rank 7" has our name but not our mark: the user wrote it, so it stays.
    assert [c["name"] for c in data["configurations"]] == [
        "Python: current file", "minitron rank 7", "minitron rank 0", "minitron rank 1"]
    assert [c["name"] for c in data["compounds"]] == ["mine", COMPOUND_NAME]
    assert (tmp_path / "launch.json.bak").read_text() == USER_FILE  # the comments live on there

    first = path.read_text()
    write_launch_json(path, 1, 7000, "127.0.0.1")  # run again: still one set of ours, no duplicates
    again = json.loads(path.read_text())
    assert [(c["name"], c["connect"]["port"]) for c in again["configurations"][1:]] == [
        ("minitron rank 7", 1), ("minitron rank 0", 7000)]
    assert again["configurations"][:2] == data["configurations"][:2]
    # Every backup is kept: the first still holds the comments, the second the first merge.
    assert (tmp_path / "launch.json.bak").read_text() == USER_FILE
    assert (tmp_path / "launch.json.bak.1").read_text() == first
    write_launch_json(path, 1, 7000, "127.0.0.1")  # nothing changes: no new backup
    assert not (tmp_path / "launch.json.bak.2").exists()


def test_only_marked_entries_are_ours(tmp_path):
    path = tmp_path / "launch.json"
    mine = {"name": "minitron rank 0 (patched)", "type": "debugpy", "request": "attach",
            "connect": {"host": "127.0.0.1", "port": 9}, "pathMappings": [], "justMyCode": True}
    path.write_text(json.dumps({"version": "0.2.0", "configurations": [mine]}))
    write_launch_json(path, 2, 5678, "127.0.0.1")
    write_launch_json(path, 3, 5678, "127.0.0.1")
    data = json.loads(path.read_text())
    assert data["configurations"][0] == mine
    assert [c["name"] for c in data["configurations"][1:]] == [f"minitron rank {r}" for r in range(3)]
    # One of the user's with exactly our name: refused, the file untouched.
    clash = {"version": "0.2.0", "configurations": [{"name": "minitron rank 1", "type": "debugpy",
                                                      "request": "attach", "port": 9}]}
    path.write_text(json.dumps(clash))
    with pytest.raises(ValueError, match="minitron did not write"):
        write_launch_json(path, 2, 5678, "127.0.0.1")
    assert json.loads(path.read_text()) == clash


@pytest.mark.parametrize("text, words", [
    ('{"configurations": [ {"name": "x" ', ["cannot read", "left untouched"]),
    ('[1, 2]', ["JSON list", "left untouched"]),
    ('{"configurations": {"name": "x"}}', ['"configurations" is not a list']),
])
def test_a_file_we_cannot_read_is_left_alone(tmp_path, text, words):
    path = tmp_path / "launch.json"
    path.write_text(text)
    with pytest.raises(ValueError) as exc:
        write_launch_json(path, 2, 5678, "127.0.0.1")
    assert all(w in str(exc.value) for w in words), str(exc.value)
    assert path.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch.json"]


def test_jsonc_stripping_leaves_strings_alone():
    text = '{"a": "x // y", /* c */ "b": "/* z */", "c": [1, 2, ], // end\n}'
    cleaned, had_comment = strip_jsonc(text)
    assert had_comment
    assert json.loads(cleaned) == {"a": "x // y", "b": "/* z */", "c": [1, 2]}
    assert strip_jsonc('{"a": "q\\"//"}') == ('{"a": "q\\"//"}', False)


def test_vscode_command(tmp_path):
    path = tmp_path / "launch.json"
    out = subprocess.run([sys.executable, "-m", "minitron", "vscode", "--world", "2", "--path", str(path)],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert str(path) in out.stdout
    assert len(ours(json.loads(path.read_text()))) == 2
    path.write_text("{ not json")
    bad = subprocess.run([sys.executable, "-m", "minitron", "vscode", "--world", "2", "--path", str(path)],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert bad.returncode == 2
    assert bad.stderr.startswith("minitron: error: cannot read") and len(bad.stderr.splitlines()) == 1
    assert path.read_text() == "{ not json"
