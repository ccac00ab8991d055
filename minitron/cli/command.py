"""What every command does with its flags before typer parses them: the short layout aliases,
and one line for a mistyped flag.

Three commands (trace, pretrain, launch) pass flags they do not know on to the ranks, because
those flags are Megatron's (``--num-layers``, ``--lr``, ...). Left alone, a typo there travels
to every rank, or hides behind "Missing option '--world'" when the typo was ``--wrld``. So the
flags are checked here, once, against the command's own options and Megatron's parser.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import List

import typer
from typer.core import TyperCommand, TyperGroup

# Megatron's long layout flags and the short aliases every layout-taking command accepts.
LAYOUT_ALIASES = {
    "--tp": "--tensor-model-parallel-size",
    "--pp": "--pipeline-model-parallel-size",
    "--cp": "--context-parallel-size",
    "--ep": "--expert-model-parallel-size",
    "--vp": "--virtual-pipeline-model-parallel-size",
}
_NUMBER = re.compile(r"^-\d|^-\.\d|^-inf$|^-nan$", re.IGNORECASE)

# click's usage error, from whichever click typer carries (its own private copy in recent typer,
# the click package in older ones): the base class of typer.BadParameter. minitron never imports
# click itself, so it works with both.
UsageError = typer.BadParameter.__mro__[1]


def megatron_flags() -> set:
    """Every flag Megatron's parser (ours, same names) accepts. Torch-free, so a typo is
    answered before torch is imported."""
    # Lazy: Megatron's parser loads only when a flag is not the command's own, so `--help` and
    # the commands without Megatron's flags never import training/.
    from minitron.training.arguments import build_parser

    return {s for action in build_parser()._actions for s in action.option_strings}


def expand_aliases(argv: List[str]) -> List[str]:
    """``--tp 2`` (or ``--tp=2``) becomes ``--tensor-model-parallel-size 2``: ranks parse
    Megatron's names only."""
    out = []
    for token in argv:
        if token == "--":
            out.append(token)
            continue
        name, eq, value = token.partition("=")
        out.append(LAYOUT_ALIASES.get(name, name) + eq + value if name in LAYOUT_ALIASES else token)
    return out


def suggest(name: str, known: set) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=2, cutoff=0.7)
    if not close and name.lstrip("-"):
        # A prefix is a strong hint too: --tensor-model → --tensor-model-parallel-size.
        close = sorted(k for k in known if k.startswith(name))[:3]
    return f"; did you mean {' or '.join(close)}?" if close else "; see `minitron {cmd} --help`"


# --- help that breaks lines only at spaces --------------------------------------------------
# click wraps help with Python's textwrap, which also breaks after a hyphen: at 80 columns
# `--global-batch-size` came out as `--global-batch-` / `size`, a flag no one can copy. So
# the help formatter hides every hyphen from the wrapper behind a non-breaking hyphen (one
# column wide, as "-" is, so the layout is the same) and puts "-" back in what it wrote.
_NO_BREAK = "\u2011"
_Context = TyperCommand.context_class   # click's classes, from whichever click typer carries
_Formatter = _Context.formatter_class


def _unbreakable(text: str) -> str:
    return text.replace("-", _NO_BREAK)


class _SpaceBreakingFormatter(_Formatter):
    def write_usage(self, prog: str, args: str = "", prefix=None) -> None:
        super().write_usage(prog, _unbreakable(args), prefix)

    def write_text(self, text: str) -> None:
        super().write_text(_unbreakable(text))

    def write_dl(self, rows, *args, **kwargs) -> None:
        super().write_dl([(term, _unbreakable(text)) for term, text in rows], *args, **kwargs)

    def getvalue(self) -> str:
        return super().getvalue().replace(_NO_BREAK, "-")


class _HelpContext(_Context):
    formatter_class = _SpaceBreakingFormatter


class MinitronGroup(TyperGroup):
    """The ``minitron`` group: its own options (--version, --help) converted plainly too."""

    context_class = _HelpContext

    def parse_args(self, ctx, args: List[str]) -> List[str]:
        for param in self.get_params(ctx):
            _plain_coercion(param)
        return super().parse_args(ctx, args)


class MinitronCommand(TyperCommand):
    """A typer command whose flags are checked for typos before parsing.

    ``forwards`` says what the command passes on: "megatron" (trace, pretrain: unknown flags must
    be Megatron's), "script" (launch: everything after the script is the script's own), or None
    (every flag must be the command's own).
    """

    forwards: str | None = None
    context_class = _HelpContext

    def parse_args(self, ctx, args: List[str]) -> List[str]:
        if self.forwards == "megatron" and self.name in ("pretrain", "estimate"):
            args = expand_aliases(args)
        self._check_flags(args)
        for param in self.get_params(ctx):
            _plain_coercion(param)
        return super().parse_args(ctx, args)

    def _own_options(self) -> tuple[set, set]:
        names, flags = set(), set()
        for param in self.params:
            opts = set(getattr(param, "opts", [])) | set(getattr(param, "secondary_opts", []))
            names |= opts
            if getattr(param, "is_flag", False):
                flags |= opts
        return names | {"--help"}, flags | {"--help"}

    def _check_flags(self, args: List[str]) -> None:
        own, own_flags = self._own_options()
        megatron = None
        expect_value = False
        for token in args:
            if token == "--":
                break  # what follows is for the ranks; parse_args checks it there
            if not token.startswith("-") or _NUMBER.match(token):
                if self.forwards == "script" and not expect_value:
                    break  # the script path: the rest belongs to the script
                expect_value = False
                continue
            name = token.split("=", 1)[0]
            if self.forwards == "script" and name in ("-m", "--module"):
                break  # the module and everything after it are the module's
            if name in own:
                expect_value = name not in own_flags and "=" not in token
                continue
            expect_value = False
            if self.forwards == "megatron":
                megatron = megatron if megatron is not None else megatron_flags()
                if name in megatron:
                    continue
                known = own | megatron
            else:
                known = own
            hint = suggest(name, known).replace("{cmd}", self.name or "")
            raise UsageError(f"no such option {name}{hint}")


# --- plain values without pydantic -------------------------------------------------------
# Recent typer coerces every option through a pydantic validator built on first use: importing
# pydantic and building ~20 validators costs ~0.15 s of CPU on every command, as much as the
# rest of the command line, and 0.5 s when an int option is given something that is not one.
# So an int, float, str, Path or bool option is converted here, and a bad number gets one line
# naming the flag (``Invalid value for '--world': expected a whole number, got '1e20'``).
# Typer offers no public hook that avoids pydantic (``parser=`` still builds a validator), so
# this sets typer's private ``_runtime_param``; pyproject.toml pins the typer versions it is
# tested with, and older typers (no ``type_descriptor``) are left alone.
#
# Any whole number that int() reads fast is taken (Python refuses past 4,300 digits): each
# command bounds its own sizes and says why (`groups --world 10**23`: at most 131072).
_DIGITS = 4000
_INT = re.compile(r"[-+]?[0-9]{1,%d}" % _DIGITS)
_PLAIN = (int, float, str, Path, bool)   # bool: --help and the flags, whose value is None when absent
_BOOLS = {"true": True, "1": True, "yes": True, "y": True, "on": True,
          "false": False, "0": False, "no": False, "n": False, "off": False}


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:20] + "..." + text[-8:])


class _PlainValue:
    def __init__(self, kind: type):
        self.kind = kind

    def coerce(self, value, param, ctx):
        kind = self.kind
        if value is None or (isinstance(value, kind) and (kind is bool or not isinstance(value, bool))):
            return value
        if kind in (str, Path):
            return kind(value)
        text = str(value).strip()
        if kind is bool:
            if text.lower() not in _BOOLS:
                raise typer.BadParameter(f"expected true or false, got {_shown(text)}", ctx=ctx, param=param)
            return _BOOLS[text.lower()]
        if kind is int:
            digits = text.lstrip("+-")
            if digits.isascii() and digits.isdigit() and not _INT.fullmatch(text):
                raise typer.BadParameter(f"a whole number of {len(text):,} digits is past any size or count "
                                         f"minitron takes", ctx=ctx, param=param)
            if not _INT.fullmatch(text):
                raise typer.BadParameter(f"expected a whole number, got {_shown(text)}",
                                         ctx=ctx, param=param)
            return int(text)
        try:
            number = float(text)
        except ValueError:
            raise typer.BadParameter(f"expected a number, got {_shown(text)}", ctx=ctx, param=param) from None
        if number != number or number in (float("inf"), float("-inf")):
            raise typer.BadParameter(f"must be a finite number, got {_shown(text)}", ctx=ctx, param=param)
        return number


def _plain_coercion(param) -> None:
    """Give ``param`` the plain conversion when typer would build a pydantic validator for a
    single int/float/str/Path with no checks attached (older typers have no such step)."""
    desc = getattr(param, "type_descriptor", None)
    if desc is None or getattr(param, "_runtime_param", False) is not None or desc.annotation not in _PLAIN:
        return
    info = desc.parameter_info
    if param.nargs != 1 or param.multiple or desc.file_annotation is not None or info.parser or \
            getattr(info, "click_type", None) or info.min is not None or info.max is not None or \
            (desc.annotation is Path and (info.exists or info.resolve_path or info.path_type)):
        return
    param._runtime_param = _PlainValue(desc.annotation)
