"""The click command that typer builds from minitron's app, built once per process.

typer builds it at every call of ``app()``: ~60 ms of reading signatures and type hints, the
larger part of a refusal's time once the modules are loaded. The refusal harnesses (refusals.py's
forked child, refusals_sequential.py) run hundreds of cases in one interpreter, so each builds it
once: the same object every case would have built. (A forked case gets its own copy.)
"""

import typer.main

_commands = {}
_build_command = typer.main.get_command


def _built_command(app):
    if id(app) not in _commands:
        _commands[id(app)] = (app, _build_command(app))   # app kept: its id stays its own
    return _commands[id(app)][1]


def build_once(app) -> None:
    """From now on typer hands out ``app``'s command built here, now."""
    typer.main.get_command = _built_command
    _built_command(app)
