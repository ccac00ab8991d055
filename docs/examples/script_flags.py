"""Megatron's example launch scripts as chapter 19 reads them: their flags, and what minitron's
parser makes of each one. The scripts themselves are data in tests/example_scripts.py (one
place: the test that records what each does reads the same lists).

    minitron estimate --world 8 $(python docs/examples/script_flags.py argv llama3_8b_bf16)
    python docs/examples/script_flags.py verdicts llama3_8b    # each flag: done, no effect, refused
    python docs/examples/script_flags.py outcomes              # every script through `minitron estimate`

`argv` prints one word per line, and the shell's $(...) splits them again as bash split the
script's arrays: a quote inside a word stays in it, as it did there.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))   # the scripts' data lives beside the test that checks them

from example_scripts import ALL  # noqa: E402  (after the path above)
from minitron.training.argument_groups import build_parser  # noqa: E402
from minitron.training.arguments_policy import NO_EFFECT, REFUSED, _NoEffect, _Refused  # noqa: E402

PLACEHOLDER = "docs-out/scripts"   # the scripts' paths, under the build's scratch folder


def verdicts(name: str) -> dict[str, list[str]]:
    """Each of the script's flags under what minitron does with it."""
    options = build_parser()._option_string_actions
    found = defaultdict(list)
    for word in ALL[name].argv(PLACEHOLDER):
        if not word.startswith("--"):
            continue
        action = options.get(word)
        if action is None:
            found["unknown to minitron (Megatron has it)"].append(word)
        elif isinstance(action, _Refused):
            found[f"refused: {REFUSED[word][1]}"].append(word)
        elif isinstance(action, _NoEffect):
            found[f"no effect: {NO_EFFECT[word][1]}"].append(word)
        else:
            found["implemented"].append(word)
    return found


def outcomes() -> None:
    """Each script through `minitron estimate` at its world, as a user would type it: "runs", or
    the one line it stops with. In this process (tests/cli_here.py runs the command's entry
    point here): nine answers for one import."""
    import textwrap

    from cli_here import minitron_here

    for name, script in ALL.items():
        done = minitron_here("estimate", "--world", str(script.world), *script.argv(PLACEHOLDER))
        said = "runs" if done.returncode == 0 else done.stderr.strip().splitlines()[-1].removeprefix("minitron: ")
        print(f"{name} ({script.world} ranks)")
        print(textwrap.fill(said, width=100, initial_indent="    ", subsequent_indent="    "))


def main(argv: list[str]) -> None:
    if argv == ["outcomes"]:
        outcomes()
        return
    if len(argv) != 2 or argv[0] not in ("argv", "verdicts") or argv[1] not in ALL:
        sys.exit(f"usage: script_flags.py argv|verdicts NAME | outcomes, NAME one of {', '.join(ALL)}")
    what, name = argv
    if what == "argv":
        print("\n".join(ALL[name].argv(PLACEHOLDER)))
        return
    script = ALL[name]
    print(f"{script.source}: {len(script.argv(PLACEHOLDER))} words, world {script.world} ({script.layout})")
    for verdict, flags in sorted(verdicts(name).items(), key=lambda kv: kv[0] != "implemented"):
        shown = f"{len(flags)} flags" if verdict == "implemented" else ", ".join(flags)
        print(f"- {verdict}\n    {shown}")


if __name__ == "__main__":
    main(sys.argv[1:])
