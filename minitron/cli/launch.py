"""`minitron launch`: any script or module on many ranks, as torchrun or DeepSpeed's runner would.

Two ways to say how many ranks: torchrun's (``--world N``) or DeepSpeed's resource options
(``--hostfile``, ``--include``/``--exclude``, ``--num_nodes``, ``--num_gpus``), which name hosts and
slots; then the ranks are the active slots (launcher/runner.py). minitron runs one machine's ranks;
``--dry-run`` shows what DeepSpeed's runner would start on every host, with each rank's environment,
without starting anything.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections import OrderedDict
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.table import Table

from minitron.cli import preflight
from minitron.cli.command import expand_aliases
from minitron.cli.common import (
    DEBUG, DEBUG_HOST, DEBUG_PORT_BASE, DEBUG_WAIT, EXTRA, HANG_TIMEOUT, DebugOptions, UserError, app,
    check_hang_timeout, check_world, console, hang_screen, rank_backend, validate_pretrain,
)

LOCAL_HOSTS = ("localhost", "127.0.0.1")


def resources(hostfile, include, exclude, num_nodes, num_gpus, world):
    """The active resources {host: [slots]}, or None when only --world was given."""
    from minitron.launcher.runner import ResourceError, active_resources  # lazy: see launch()

    if hostfile is None and not include and not exclude and num_nodes < 0 and num_gpus < 0:
        return None
    if hostfile is not None and not hostfile.is_file():
        raise UserError(f"--hostfile {hostfile}: no such file (one 'HOST slots=N' line per host)")
    try:
        # Without a hostfile the pool is this machine; DeepSpeed counts its GPUs, minitron takes
        # --world (or one slot per core) as the number of slots it offers.
        return active_resources(hostfile, world or os.cpu_count() or 1, include, exclude, num_nodes, num_gpus)
    except ResourceError as exc:
        raise UserError(str(exc)) from None


def cores_to_share(bind_cores_to_rank: bool, listed: Optional[str], dry_run: bool) -> Optional[list]:
    """The cores --bind_cores_to_rank splits among a host's ranks: --bind_core_list, else every
    core this process may run on. (DeepSpeed takes cores 0..N-1 for N physical cores; in a
    container or under taskset some of those are not ours, and pinning to them fails.) A dry
    run may name any cores: it describes hosts, not this process."""
    from minitron.launcher.runner import ResourceError, parse_range_list  # lazy: see launch()

    if listed is not None and not bind_cores_to_rank:
        raise UserError("--bind_core_list names the cores --bind_cores_to_rank splits: add --bind_cores_to_rank")
    if not bind_cores_to_rank:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if listed is None:
        return allowed
    try:
        cores = parse_range_list(listed)
    except ResourceError as exc:
        raise UserError(str(exc)) from None
    foreign = [] if dry_run else [c for c in cores if c not in allowed]
    if foreign:
        raise UserError(f"--bind_core_list {listed}: this process may not run on core(s) "
                        f"{', '.join(map(str, foreign))} (it may use {', '.join(map(str, allowed))})")
    return cores


def check_no_python(no_python: bool, module, args: list, backend, trace_dir, debug) -> None:
    """--no_python: the program itself on every rank, no interpreter in front (DeepSpeed's launch.py)."""
    if not no_python:
        return
    if module:  # DeepSpeed refuses the pair too
        raise UserError("--no_python runs a program directly and --module runs a Python module: use one")
    program = args[0]
    found = os.access(program, os.X_OK) and Path(program).is_file() if os.sep in program else shutil.which(program)
    if not found:
        raise UserError(f"--no_python: {program!r} is not an executable file or a program on PATH")
    for given, flag in ((backend, "--backend"), (trace_dir, "--trace"), (debug, "--debug")):
        if given:
            raise UserError(f"{flag} works inside minitron's Python ranks; a --no_python program runs on its "
                            f"own: drop {flag}")


@contextmanager
def saved_pid(enabled: bool):
    """--save_pid: DeepSpeed's launch.py prints ``launcher pid: N`` and writes N into
    /tmp/<runner pid>.deepspeed, where a program that started the job finds whom to signal.
    Runner and launcher are one process here, so both numbers are our pid. DeepSpeed removes
    the file only when SIGINT or SIGTERM reaches the launcher; a job that ends (well or not)
    leaves it behind. Here it goes however the launch ends: a SIGTERM becomes an exit that
    stops the ranks first."""
    if not enabled:
        yield
        return
    from minitron.launcher.runner import PID_FILE_BASEPATH  # lazy: see launch()

    pid = os.getpid()
    path = Path(PID_FILE_BASEPATH) / f"{pid}.deepspeed"
    if path.exists():
        raise UserError(f"--save_pid: {path} exists (left by an earlier launcher with this pid): remove it")
    console.print(f"launcher pid: {pid}")
    path.write_text(str(pid))

    def stop(signum, frame):
        if os.getpid() != pid:   # a forked rank inherited this handler: die as it would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        path.unlink(missing_ok=True)


def show_dry_run(world_info, master_addr: str, master_port: int, program: list, flags: list,
                 cores: Optional[list] = None) -> None:
    from minitron.launcher.runner import encode_world_info, node_command, node_rank_env  # lazy: see launch()

    console.print(f"active resources: {json.dumps(world_info)}")
    encoded = encode_world_info(world_info)
    console.print(f"world_info, base64 (WORLD_INFO below):\n  {encoded}", soft_wrap=True, highlight=False)
    console.print("runner would run:")
    pieces = node_command(world_info, master_addr, master_port, program, flags)
    command = " \\\n    ".join(piece.replace(encoded, "$WORLD_INFO") for piece in pieces)
    console.print(f"  {command}", soft_wrap=True, markup=False, highlight=False)
    world = sum(len(slots) for slots in world_info.values())
    console.print(f"each rank's environment as launch.py sets it (WORLD_SIZE={world}, CROSS_SIZE={len(world_info)}):")
    table = Table(box=box.SIMPLE_HEAD)
    keys = ("RANK", "LOCAL_RANK", "CROSS_RANK", "LOCAL_SIZE", "CUDA_VISIBLE_DEVICES")
    table.add_column("host")
    for key in keys:
        table.add_column("devices" if key == "CUDA_VISIBLE_DEVICES" else key, justify="right")
    if cores is not None:
        table.add_column("cores", justify="right")
    for node_rank, host in enumerate(world_info):
        for env in node_rank_env(world_info, node_rank, master_addr, master_port):
            row = [env[k] for k in keys]
            if cores is not None:
                row.append(_core_text(rank_cores(cores, int(env["LOCAL_SIZE"]), int(env["LOCAL_RANK"]))))
            table.add_row(host, *row)
    console.print(table)
    if cores is not None:
        console.print(f"cores: --bind_cores_to_rank's share of {_core_text(cores)} (this machine's list; "
                      "each host splits its own), OMP_NUM_THREADS = its size")
    console.print("devices: CUDA_VISIBLE_DEVICES. LOCAL_RANK is launch.py's RANK % LOCAL_SIZE:\n"
                  "the process's index on its host only if the hosts before it have as many slots.")


def rank_cores(cores: list, local_size: int, local_rank: int) -> list:
    from minitron.launcher.runner import ResourceError, cores_for_rank  # lazy: see launch()

    try:
        return cores_for_rank(cores, local_size, local_rank)
    except ResourceError as exc:
        raise UserError(str(exc)) from None


def _core_text(cores: list) -> str:
    """[0, 1, 2, 5] -> '0-2,5'"""
    runs: list = []
    for c in cores:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


@app.command(context_settings=EXTRA)
def launch(
    ctx: typer.Context,
    world: Optional[int] = typer.Option(None, "--world", "-w", help="number of ranks (or use DeepSpeed's options)"),
    module: Optional[str] = typer.Option(None, "--module", "-m", help="run a module as __main__ (like python -m)"),
    backend: Optional[str] = typer.Option(None, "--backend", help="gloo (forked CPU ranks) or nccl (one GPU each)"),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", "--enable_each_rank_log",
                                           help="per-rank logs instead of this terminal"),
    master_port: Optional[int] = typer.Option(None, "--master-port", "--master_port"),
    trace_dir: Optional[Path] = typer.Option(None, "--trace", help="record every rank's calls into this directory"),
    hostfile: Optional[Path] = typer.Option(None, "--hostfile", "-H", help="DeepSpeed's hostfile: 'HOST slots=N' lines"),
    include: str = typer.Option("", "--include", "-i", help="hosts/slots to use, e.g. localhost:0,1@worker-1"),
    exclude: str = typer.Option("", "--exclude", "-e", help="hosts/slots to leave out, same format"),
    num_nodes: int = typer.Option(-1, "--num_nodes", help="use the first N hosts of the pool"),
    num_gpus: int = typer.Option(-1, "--num_gpus", "--num_accelerators", help="use slots 0..N-1 of every host"),
    no_local_rank: bool = typer.Option(False, "--no_local_rank", help="with DeepSpeed's options: do not pass "
                                       "--local_rank=N to the script (DeepSpeed passes it; torchrun does not)"),
    world_info: Optional[str] = typer.Option(None, "--world_info", help="launch.py's view: the base64 world info "
                                             "the runner passes (instead of a hostfile)"),
    save_pid: bool = typer.Option(False, "--save_pid", help="print the launcher's pid and write it to "
                                  "/tmp/<pid>.deepspeed while the job runs (DeepSpeed's file)"),
    bind_cores_to_rank: bool = typer.Option(False, "--bind_cores_to_rank", help="pin each rank to its own share "
                                            "of the cores (and set OMP_NUM_THREADS to its size)"),
    bind_core_list: Optional[str] = typer.Option(None, "--bind_core_list", help="the cores to share out, "
                                                 "e.g. 0-3,8 (default: every core this process may use)"),
    no_python: bool = typer.Option(False, "--no_python", help="run the program itself on every rank, "
                                   "not with python (refused with --module)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the resource pool, world_info, the per-node "
                                                         "commands and each rank's environment; start nothing"),
    debug: Optional[str] = DEBUG, debug_port_base: int = DEBUG_PORT_BASE, debug_host: str = DEBUG_HOST,
    debug_wait_timeout: float = DEBUG_WAIT, hang_timeout: Optional[float] = HANG_TIMEOUT,
):
    """Run SCRIPT [ARGS...] (or -m MODULE [ARGS...]) on WORLD ranks, as torchrun would."""
    # Every launcher import in this module is lazy, inside a function: `minitron --help` and
    # every other command import this module too, and only `launch` needs the launcher.
    from minitron.launcher import LaunchConfig, Target
    from minitron.launcher import launch as run

    args = list(ctx.args)
    if not module and not args:
        raise UserError("nothing to run: give a script path or -m MODULE")
    check_no_python(no_python, module, args, backend, trace_dir, debug)
    check_hang_timeout(hang_timeout, trace_dir is not None)
    if not module and not no_python and not dry_run and not Path(args[0]).is_file():
        raise UserError(f"no such script: {args[0]}")
    cores = cores_to_share(bind_cores_to_rank, bind_core_list, dry_run)
    from minitron.launcher.runner import ResourceError, decode_world_info  # lazy: see launch()
    if world_info is not None:
        if hostfile or include or exclude or num_nodes >= 0 or num_gpus >= 0:
            raise UserError("--world_info already says which hosts and slots: drop --hostfile/--include/--exclude/"
                            "--num_nodes/--num_gpus")
        try:
            pool = decode_world_info(world_info)
        except ResourceError as exc:
            raise UserError(str(exc)) from None
    else:
        pool = resources(hostfile, include, exclude, num_nodes, num_gpus, world)
    if pool is None and world is None:
        raise UserError("how many ranks? give --world N, or DeepSpeed's --hostfile/--include/--num_gpus")
    program = (["--module", module] if module else []) + args
    if dry_run:
        if pool is None:
            from minitron.launcher.runner import check_slot_count  # lazy: see launch()
            check_world(world)
            try:  # a row per rank: 10**9 of them would be gigabytes before the first line
                check_slot_count("localhost", world, f"--world {world}")
            except ResourceError as exc:
                raise UserError(str(exc)) from None
            pool = OrderedDict(localhost=list(range(world)))
        if cores is not None:   # every host's split must work before anything is shown
            for slots in pool.values():
                rank_cores(cores, len(slots), 0)
        # What DeepSpeed's runner hands on to launch.py, in its order.
        flags = [flag for flag, given in (("--no_python", no_python), ("--no_local_rank", no_local_rank))
                 if given]
        flags += ["--save_pid", str(os.getpid())] if save_pid else []
        flags += ["--bind_cores_to_rank"] if bind_cores_to_rank else []
        flags += [f"--bind_core_list={bind_core_list}"] if bind_core_list else []
        show_dry_run(pool, "127.0.0.1" if list(pool) == ["localhost"] else list(pool)[0],
                     master_port or 29500, program, flags, cores)
        return
    env = {}
    if pool is not None:
        hosts = list(pool)
        if hosts[0] not in LOCAL_HOSTS or len(hosts) > 1:
            raise UserError(f"the pool spans {', '.join(hosts)}: minitron starts this machine's ranks only; "
                            "run torchrun on each host, or see DeepSpeed's commands with --dry-run")
        size = len(pool[hosts[0]])
        if world is not None and world != size:
            raise UserError(f"--world {world} disagrees with the {size} slots the resource options select")
        world = size
    check_world(world)
    if cores is not None:
        per_rank = len(rank_cores(cores, world, 0))
        from minitron.launcher.runner import BIND_CORE_LIST_ENV  # lazy: see launch()
        env.update({BIND_CORE_LIST_ENV: ",".join(map(str, cores)), "OMP_NUM_THREADS": str(per_rank)})
    places = {}  # where the ranks will write, beyond the logs and the trace
    if module:
        if module == "minitron.pretrain_gpt":  # Megatron's flags: the short layout aliases too
            args = expand_aliases(args)
            megatron = validate_pretrain(args, world)
            places["--save"] = megatron.save  # a run must not train for an hour, then fail to save
            if megatron.log_jsonl:
                preflight.check_output_file(megatron.log_jsonl, "--log-jsonl")
        target = Target(module=module, argv=args)
    elif no_python:
        from minitron.launcher.runner import exec_program  # lazy: see launch()
        # A forked rank that execs the program: the environment is set, the interpreter goes.
        target = Target(function=partial(exec_program, args, pool is not None and not no_local_rank))
        backend = "gloo"
    else:
        target = Target(script=args[0], argv=args[1:])
    if module:
        preflight.check_module(module)
    preflight.check_launch(world, backend or "gloo", master_port, {"--log-dir": log_dir, "--trace": trace_dir, **places})
    # Last, as it may ask torch whether a GPU is there: every refusal above stays instant.
    backend = rank_backend(backend, world, "--backend fake plays ranks without processes of their own: use it "
                                           "with `minitron trace`")
    if pool is not None and backend == "nccl":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, pool[list(pool)[0]]))
    env.update(DebugOptions(debug, debug_port_base, debug_host, debug_wait_timeout).env(world, trace_dir))
    # DeepSpeed's launch.py passes --local_rank=N unless told not to; torchrun (--world) does not.
    local_rank_arg = pool is not None and not no_local_rank and not no_python   # exec_program passes it
    # torch.optim's torch._dynamo is worth importing once before the fork only for a program known
    # to build an optimizer (2-3 s); any other script imports what it needs, as under torchrun.
    warm = LaunchConfig.warm if module == "minitron.pretrain_gpt" else ()
    with saved_pid(save_pid):
        run(LaunchConfig(world_size=world, backend=backend, log_dir=log_dir, master_port=master_port, env=env,
                         local_rank_arg=local_rank_arg, warm=warm, hang_timeout=hang_timeout), target,
            on_hang=hang_screen() if hang_timeout else None)
