"""The ``minitron`` command. One module per command, named after it:

    trace      run initialization (and optionally training steps) on W ranks, traced
    view       read a trace directory again: call trees, groups, checks, schedule
    groups     Megatron's process groups for a layout, no process started
    vscode     write .vscode/launch.json to attach to each rank
    launch     any script on W ranks, with torchrun's or DeepSpeed's runner environment
    pretrain   train a GPT on W ranks with Megatron's flags
    preprocess turn a JSONL corpus into indexed-dataset files
    ds-config  resolve a DeepSpeed config as deepspeed.initialize would (ds_config.py)
    estimate   memory and communication per rank for a layout, predicted (and --check'ed)
    diff       compare two trace directories
    ckpt       inspect a torch_dist checkpoint: its tensors, chunks and who wrote each

Every command validates its input in this process, before any rank starts: a bad layout or
batch size is one line on stderr and exit code 2, never a traceback from 16 ranks.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from importlib.metadata import PackageNotFoundError, version

import typer

# Each module registers its commands on the app; this order is the order `--help` lists them.
from minitron.cli import trace, view, groups, vscode, launch, pretrain, preprocess  # noqa: F401,I001
from minitron.cli import ds_config, estimate, diff, ckpt  # noqa: F401,I001
from minitron.cli.command import MinitronCommand, UsageError
from minitron.cli.common import UserError, app

# What each command passes on that is not its own flag (see MinitronCommand).
FORWARDS = {"trace": "megatron", "pretrain": "megatron", "launch": "script"}
FORWARDS["estimate"] = "megatron"   # estimate takes pretrain's flags


def _prepare_commands() -> None:
    """Give every registered command minitron's flag checks and its whole first line in
    ``minitron --help`` (click would cut it at about 45 characters)."""
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")
        info.cls = type(f"{name.title()}Command", (MinitronCommand,), {"forwards": FORWARDS.get(name)})
        info.short_help = first_sentence(info.callback.__doc__ or "")


def first_sentence(doc: str) -> str:
    """The docstring's first sentence, however many source lines it spans."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    return paragraph.split(". ")[0].rstrip(".") + "."


def _version(value: bool) -> None:
    if value:
        try:
            print(f"minitron {version('minitron')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print("minitron (not installed)")
        raise typer.Exit()


@app.callback()
def _top(show_version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                           help="print minitron's version and exit")):
    """minitron: Megatron-LM's GPT pretraining path, small and traced."""


_prepare_commands()
# At exit Python runs one last full collection over every object before it tears the modules
# down: 0.6 s after `import torch` (2 cores), to free memory the OS takes back a moment later.
# Frozen objects are skipped: the command exits in 0.2 s. (The executable, run() below, skips
# the tear-down altogether; this is for main() called in a process that goes on, as tests do.)
atexit.register(gc.freeze)
# "Stop here" and "the user pressed Ctrl-C": typer's own classes, and click's where the click that
# typer carries has its own (the module of its usage errors; recent typer keeps only its own).
_click_exceptions = sys.modules[UsageError.__module__]
ABORT = tuple({typer.Abort, getattr(_click_exceptions, "Abort", typer.Abort)})
EXIT = tuple({typer.Exit, getattr(_click_exceptions, "Exit", typer.Exit)})


def main() -> None:
    """Entry point: turn every kind of bad input into one line and a non-zero exit."""

    def fail(message: str, code: int) -> None:
        print(f"minitron: {message}", file=sys.stderr)  # plain print: never wrapped, never styled
        sys.exit(code)

    def interrupted() -> None:
        # Only commands that start ranks import the launcher; it stops them all before the
        # KeyboardInterrupt reaches us (launcher.launch's except clause).
        ranks = "; every rank was stopped" if "minitron.launcher.launch" in sys.modules else ""
        fail(f"interrupted{ranks}", 130)

    # A command builds long-lived state (torch's ~170,000 objects, a trace's records) and frees
    # little; the cyclic collector would walk all of it again and again and find next to
    # nothing: off, a 16-rank `trace` takes ~0.5 s less (2 cores). The forked ranks turn it back
    # on for themselves (launcher.launch). A `pretrain` supervisor leaves no cycles behind as it
    # refreshes its display: 9,146 objects to collect at exit after 30 iterations, as after 900.
    collecting = gc.isenabled()
    gc.disable()
    try:
        code = app(standalone_mode=False)
    except UserError as exc:
        fail(f"error: {exc}", 2)
    except UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `minitron`: the help is the answer
            print(exc.format_message())
            sys.exit(0)
        fail(f"error: {exc.format_message()}", 2)
    except KeyboardInterrupt:
        interrupted()
    except ABORT:
        interrupted()
    except EXIT as exc:
        sys.exit(getattr(exc, "exit_code", 0))
    except Exception as exc:  # noqa: BLE001 -- the failures of a run that started, named in one line
        # Lazy: only a command that started ranks can end here with RankFailure, and it has
        # loaded the launcher already; --help and bad input never pay for it.
        from minitron.launcher import RankFailure

        if not isinstance(exc, RankFailure):
            raise
        tail = exc.log_tail()
        fail(f"{exc}" + (f"\n--- last lines of its log ---\n{tail}" if tail else ""), 1)
    finally:
        if collecting:  # main() is also called in-process (tests): leave the caller's collector as it was
            gc.enable()
    # With standalone_mode=False a command's typer.Exit(n) comes back as the return value, and
    # typer turns Ctrl-C inside a command into exactly such an exit with 130.
    if code == 130:
        interrupted()
    sys.exit(code if isinstance(code, int) else 0)


def run() -> None:
    """The `minitron` executable (pyproject's entry point) and `python -m minitron`: main(), then
    out without tearing the interpreter down.

    Python's own exit frees every object one by one, torch's modules and a trace's records
    among them: 0.05-0.1 s of CPU after a trace (2 cores, collector frozen as below), only for
    the OS to take the whole address space back a moment later. So once main() is
    done, everything an exit owes the user happens here (what Python waits for: threads that
    are not daemons; the atexit hooks; the output flushed) and the process leaves with
    os._exit. main() itself exits the ordinary way: tests call it in a process that goes on.
    """
    try:
        main()
        code = 0
    except SystemExit as exc:  # how main() always ends; any other exception prints as usual
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)  # sys.exit("message"), as Python would print it
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`minitron ... | head`): nothing left to tell
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
