"""docs/hooks/warm_shim.py: in a command that bash runs, `minitron` and `python` are stand-ins
that fork the call from the build's warm runner. Checked here: such a call really runs warm
(torch is already imported when the script starts), yet every command prints what plain bash
prints -- pipes, `$(...)`, `$PIPESTATUS`, stdin, stderr beside stdout, exit codes -- and what
the stand-in cannot hand over (`python -c`) runs for real."""

from __future__ import annotations

import subprocess

from test_docs import load_hook

COMMANDS = [
    'python p.py 2>/dev/null | sort; echo "rc ${PIPESTATUS[0]}"',
    "python p.py 3 2>&1; echo rc $?",
    "echo $(python p.py 2>/dev/null) done",
    "echo hi | python upper.py && python3 -c 'print(6 * 7)'",
    'minitron trace --wrld 16; echo "(exit code $?)"',
    "minitron groups --world 8 --tp 2 | head -3",
    "python -m json.tool <<< '{\"a\": 1}' && cat p.py | python upper.py | head -1",
]


def test_bash_commands_call_minitron_and_python_warm_and_print_what_bash_prints(tmp_path):
    (tmp_path / "p.py").write_text("import sys\nprint('b'); print('a'); print('oops', file=sys.stderr); print('c')\n"
                                   "sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)\n")
    (tmp_path / "upper.py").write_text("import sys\nprint(sys.stdin.read().upper(), end='')\n")
    (tmp_path / "warm.py").write_text("import sys\nprint('torch' in sys.modules)\n")
    (tmp_path / "calls.py").write_text("import subprocess\nsubprocess.run(['python', 'warm.py'], check=True)\n")
    hook = load_hook()
    hook._cache.clear()
    hook._warm.expected = True   # as in a build with pages to run (on_files sets it)
    try:
        scratch = hook.scratch_dir(tmp_path)
        # `;` keeps it with bash; the script sees the warm runner's torch, not a fresh interpreter's.
        assert hook.execute("python warm.py; true", "page.md", tmp_path) == "True"
        # A script the runner runs warm (no bash) that calls `python` itself: the call is warm too.
        assert hook._warm.module.warm_plan("python calls.py", str(hook.command_env()["PATH"]).split(":")[0])
        assert hook.execute("python calls.py", "page.md", tmp_path) == "True"
        for command in COMMANDS:
            shown = hook.execute(command, "page.md", tmp_path)
            bash = subprocess.run(["bash", "-c", command], cwd=scratch, env=hook.command_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert shown == hook.clean(bash.stdout, hook.places(tmp_path)), command
        assert subprocess.run(["bash", "-c", "python warm.py"], cwd=scratch, env=hook.command_env(),
                              capture_output=True, text=True).stdout.strip() == "False"   # the control
    finally:
        hook.on_post_build(None)
