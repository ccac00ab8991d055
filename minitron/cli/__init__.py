"""The ``minitron`` command: trace, groups, launch, pretrain, preprocess, vscode.

Every command validates its input in this process, before any rank starts: a bad layout or
batch size is one line on stderr and exit code 2, never a traceback from 16 ranks.
"""

from __future__ import annotations

import sys

import click
import typer

# Each module registers its commands on the app; this order is the order `--help` lists them.
from minitron.cli import trace, tools, train, view  # noqa: F401,I001
from minitron.cli.common import UserError, app


def main() -> None:
    """Entry point: turn every kind of bad input into one line and a non-zero exit."""
    from minitron.launcher import RankFailure

    # typer carries its own copy of click; its usage errors derive from this class.
    usage_error = typer.BadParameter.__mro__[1]

    def fail(message: str, code: int) -> None:
        print(f"minitron: {message}", file=sys.stderr)  # plain print: never wrapped, never styled
        sys.exit(code)

    try:
        code = app(standalone_mode=False)
    except UserError as exc:
        fail(f"error: {exc}", 2)
    except (usage_error, click.UsageError) as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `minitron`: the help is the answer
            print(exc.format_message())
            sys.exit(0)
        fail(f"error: {exc.format_message()}", 2)
    except RankFailure as failure:
        tail = failure.log_tail()
        fail(f"{failure}" + (f"\n--- last lines of its log ---\n{tail}" if tail else ""), 1)
    except (KeyboardInterrupt, click.Abort, typer.Abort):
        fail("interrupted; every rank was stopped", 130)
    except (typer.Exit, click.exceptions.Exit) as exc:
        sys.exit(getattr(exc, "exit_code", 0))
    # With standalone_mode=False, a command's typer.Exit(n) comes back as the return value.
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
