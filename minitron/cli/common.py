"""What every command shares: the typer app, the one-line error, the checks that run before
any process starts, and the debugger options."""

from __future__ import annotations

import os
from typing import List, Optional

import typer
from rich.console import Console

from minitron.cli.command import MinitronGroup
from minitron.core.rank_generator import DEFAULT_ORDER, TP_PP_DP_ORDER

app = typer.Typer(cls=MinitronGroup, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  pretty_exceptions_show_locals=False,
                  help="minitron: Megatron-LM's GPT pretraining path, small and traced.")
console = Console()
EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}
ORDERS = (DEFAULT_ORDER, TP_PP_DP_ORDER)


class UserError(Exception):
    """Bad input: printed as one line, exit code 2."""


def check_order(order: str) -> None:
    if order not in ORDERS:
        raise UserError(f"--order {order!r} is not one Megatron builds; use {ORDERS[0]} (default) "
                        f"or {ORDERS[1]}")


def default_backend(world: int) -> str:
    """The backend when none is given: nccl where each of the ``world`` ranks can have a GPU of
    its own, gloo (CPU ranks) otherwise. Said without torch on a machine with no GPU device
    node (the accelerator asks torch, seconds, and finds the same), so a later refusal (memory,
    the output places) stays torch-free there. On a one-GPU laptop the README's 16-rank trace
    thus runs on CPU ranks, as it does without a GPU, and says why."""
    # lazy: the GPU probe lives beside validate_args' nccl check; only commands that start ranks ask
    from minitron.training.arguments import gpus_possible
    if "MINITRON_ACCELERATOR" not in os.environ and not gpus_possible():
        return "gloo"
    from minitron.accelerator import get_accelerator  # lazy: the accelerator imports torch
    if get_accelerator().communication_backend_name() != "nccl":
        return "gloo"
    import torch  # loaded by the accelerator above
    gpus = torch.cuda.device_count()
    if gpus >= world:
        return "nccl"
    if gpus:   # a user with GPUs may have meant them: say why these ranks are CPU ranks
            console.print(f"no --backend: {world} ranks and {gpus} GPUs here, so gloo (CPU ranks); --backend "
                          "nccl runs one rank per GPU", highlight=False, soft_wrap=True)
    return "gloo"


def check_backend(backend: str, world: int) -> None:
    if backend not in ("gloo", "nccl", "fake"):
        raise UserError(f"--backend {backend!r}: use gloo (CPU), nccl (GPU) or fake (ranks played in turn, no communication)")
    if backend == "nccl":
        # lazy: only nccl asks how many GPUs there are; torch (seconds) only where there may be some
        from minitron.training.arguments import gpus_possible
        if gpus_possible():
            import torch  # lazy: counting the GPUs is torch's to do
            gpus = torch.cuda.device_count()
        else:
            gpus = 0
        if gpus < world:
            raise UserError(f"--backend nccl runs one rank per GPU: {world} ranks need {world} GPUs, "
                            f"this machine has {gpus}; use --backend gloo (CPU) or fake")


def without_backend(argv: List[str]) -> List[str]:
    """``argv`` less its --distributed-backend: for the commands that start no real rank
    (estimate counts, a fake play moves nothing), a GPU job's own flags (nccl, as Megatron's
    scripts pass them) must not ask this machine for GPUs."""
    kept, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == "--distributed-backend":
            skip = True
        elif not word.startswith("--distributed-backend="):
            kept.append(word)
    return kept


def flag_value(argv: List[str], flag: str) -> str | None:
    """The value ``argv`` gives ``flag`` (its last one, as argparse takes it), or None. For the
    early checks that must see a Megatron flag after `--` before validate_args parses them all."""
    value = None
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return value


def validate_pretrain(argv: List[str], world: int):
    """Parse and validate ``argv`` here, as rank 0 of ``world`` will, before any process exists.

    This process is not a rank, so it does not ask the environment who it is (parse_args
    would); it states the world it is about to start. Nothing on this path imports torch: a
    backend the flags leave open stays None here (validate_args would ask the accelerator,
    i.e. torch), and the command decides it with default_backend() once its own cheap checks
    have passed. The ranks, asking the same accelerator, decide the same way."""
    # Only the commands that start ranks validate Megatron's flags; the others skip the import.
    from minitron.training.arguments import GPT_ARGS_DEFAULTS, megatron_parser, validate_args

    try:
        args = megatron_parser().parse_args(argv)  # built once: the forked ranks inherit it
        args.world_size, args.rank, args.local_rank = world, 0, 0
        open_backend = args.distributed_backend is None
        if open_backend:
            args.distributed_backend = "gloo"  # a stand-in: only nccl is checked further (GPU count)
        args = validate_args(args, GPT_ARGS_DEFAULTS)
    except ValueError as exc:  # ArgumentError is one; a dataset check may raise a plain one
        raise UserError(str(exc)) from None
    if open_backend:
        args.distributed_backend = None
    return args


def print_no_effect(args) -> None:
    """The header's list of Megatron flags accepted without effect here (arguments_policy.py)."""
    # lazy: arguments_policy sits with the training arguments, which only some commands load
    from minitron.training.arguments_policy import no_effect_lines
    for line in no_effect_lines(args):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


class DebugOptions:
    """--debug and friends, shared by trace and launch. They travel to the ranks as environment
    variables (launcher/debug.py reads them), so torchrun users can set the same variables."""

    def __init__(self, ranks: Optional[str], port_base: int, host: str, wait_timeout: float):
        self.ranks, self.port_base, self.host, self.wait_timeout = ranks, port_base, host, wait_timeout

    def check(self, world: int) -> None:
        """Refuse a bad option now, before any other work: every option is checked, with --debug
        or without (as if rank 0 were asked for), so a wrong one never waits for a later run."""
        # lazy: only commands that start ranks load the launcher's debug module (stdlib only)
        from minitron.launcher.debug import debug_env
        try:
            debug_env(self.ranks or "0", world, self.port_base, self.host, self.wait_timeout)
        except ValueError as exc:
            raise UserError(str(exc)) from None

    def env(self, world: int, trace_dir=None) -> dict:
        """Every rank's session variables: these options, and tracing into ``trace_dir``."""
        from minitron.launcher import session_env  # lazy: only commands that start ranks load the launcher
        try:
            env = session_env(world, trace_dir, self.ranks, self.port_base, self.host, self.wait_timeout)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if self.ranks and self.host not in ("127.0.0.1", "localhost", "::1"):
            Console(stderr=True).print(
                f"[yellow]warning: debugger ports listen on {self.host}: anyone who can reach them "
                f"can run code in the ranks[/yellow]")
        return env


# The layout options, the same on every command that takes a layout: Megatron's long flag and
# the short alias name one option (pretrain, which passes Megatron's flags through, expands the
# aliases instead: cli/command.py).
TP = typer.Option(1, "--tp", "--tensor-model-parallel-size", help="tensor-parallel size")
PP = typer.Option(1, "--pp", "--pipeline-model-parallel-size", help="pipeline-parallel size (stages)")
CP = typer.Option(1, "--cp", "--context-parallel-size", help="context-parallel size")
EP = typer.Option(1, "--ep", "--expert-model-parallel-size", help="expert-parallel size")


def vp_option(help: str):
    return typer.Option(None, "--vp", "--virtual-pipeline-model-parallel-size", help=help)


# The same four options on every command that starts ranks.
DEBUG = typer.Option(None, "--debug", help="ranks that wait for a debugger: 3, 0,2, 1-3 or all")
DEBUG_PORT_BASE = typer.Option(5678, "--debug-port-base", help="rank R listens on BASE+R")
DEBUG_HOST = typer.Option("127.0.0.1", "--debug-host", help="address to listen on (loopback by default)")
DEBUG_WAIT = typer.Option(600.0, "--debug-wait-timeout", help="seconds a rank waits for its debugger before the job ends")
HANG_TIMEOUT = typer.Option(None, "--hang-timeout", metavar="SECONDS", help="when no rank finishes a traced call "
                            "for this long, show which rank, group and call the job waits in, then stop it")


def check_hang_timeout(seconds: Optional[float], traced: bool) -> None:
    """--hang-timeout: a positive number of seconds, and a trace to read where the ranks wait."""
    if seconds is None:
        return
    if not 0 < seconds < float("inf"):
        raise UserError(f"--hang-timeout must be a positive number of seconds, got {seconds:g}")
    if not traced:
        raise UserError("--hang-timeout reads the ranks' trace to say where they wait: add --trace DIR")


def hang_screen():
    """What the launcher calls once a job hung: the diagnosis, printed while the ranks live."""
    from minitron.cli.views.hang import show_hang  # lazy: only a hung job loads the screen
    return lambda trace_dir, silent, timeout: show_hang(console, trace_dir, silent, timeout)


def rank_backend(backend: Optional[str], world: int, fake_reason: str) -> str:
    """The backend that will run real rank processes: the given one or the accelerator's
    default, checked against this machine. ``fake_reason`` says why fake cannot do the job."""
    backend = backend or default_backend(world)
    if backend == "fake":
        raise UserError(fake_reason)
    check_backend(backend, world)
    return backend


def check_world(world: int) -> None:
    """At least one rank. Each command then asks preflight.check_world_limit how many it can
    hold, before any other check: the layout's checks take time and memory that grow with it."""
    if world < 1:
        raise UserError(f"--world must be at least 1, got {world}")
