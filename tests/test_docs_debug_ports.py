"""Run lines that start a debug adapter: each build listens on free ports of its own, and the
page shows the default base's ports (docs/hooks/command_run.py, debug_ports)."""

from __future__ import annotations

import socket

from test_docs import load_hook


def test_a_command_naming_the_base_gets_free_ports_shown_as_the_defaults(tmp_path):
    hook = load_hook()
    hook._cache.clear()
    page = '<!-- run: echo "rank 1 waits on 127.0.0.1:$((DEBUG_PORT_BASE + 1)); base $DEBUG_PORT_BASE" -->'
    out = hook.expand(page, "page.md", tmp_path).splitlines()
    assert out[1].startswith("rank 1 waits on 127.0.0.1:5679; base "), out
    base = int(out[1].rsplit(" ", 1)[1])      # the real base: a bare number is left as it is
    assert base != 5678
    with socket.socket() as s:
        s.bind(("127.0.0.1", base + 1))       # free: nothing of the build holds it


def test_other_commands_get_no_variable_and_no_mapping():
    hook = load_hook()
    assert hook.debug_ports("minitron trace --world 2 --debug 1 --debug-port-base 45678") == ({}, {})
    variables, shown = hook.debug_ports("minitron trace --debug 1 --debug-port-base ${DEBUG_PORT_BASE}")
    base = int(variables["DEBUG_PORT_BASE"])
    assert shown[f":{base}"] == ":5678" and shown[f":{base + 7}"] == ":5685"
