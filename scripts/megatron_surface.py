"""How much of Megatron-LM's launch surface minitron takes: every launch unit of a Megatron-LM
checkout through minitron's parser and validate_args, in this process, without starting a rank.

    .venv/bin/python scripts/megatron_surface.py --megatron /path/to/Megatron-LM [--units] [--top 15]

A launch unit is one of
  script   a shell script under examples/ that runs pretrain_gpt.py / pretrain_hybrid.py /
           pretrain_mamba.py: its flags after the script's name, with the variables the script
           assigns (strings, arrays, ``+=``, ``${X:-default}``) expanded as a shell would (a
           wrapper that passes only a variable its callers set names no flag: not a unit);
  model    a model configuration of examples/post_training/modelopt/conf/ (its MODEL_ARGS);
  ci       a CI training case, tests/functional_tests/test_cases/**/model_config.yaml whose
           MODEL_ARGS are Megatron flags (not NeMo's) and whose MODE is not inference; its ENV_VARS
           are set while it is validated (--deterministic-mode reads them).
Hybrid units (Mamba layers: pretrain_hybrid/mamba, --hybrid-layer-pattern, test_cases/hybrid) are
counted apart; BERT, T5 and multimodal cases are not GPT launches and are left out.

What a unit names on disk is replaced by mock data: --data-path and the tokenizer's files give way
to --mock-data and NullTokenizer (a tokenizer type minitron lacks is kept, to be refused), --load
is dropped (a fresh run), --save goes to a scratch folder, the backend is gloo, and a variable the
script leaves unset (``$1``) reads 1. The world is the smallest the layout tiles (8 per node for a
CI case that names its nodes, when the layout fits).

A refused unit is tried again without the flag that blocked it until it passes or its refusal
names no flag it has, so each unit lists every blocker, and the totals count, per flag, the units
it blocks. Nothing of the checkout is copied; it is read where it is.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))   # surface_units, surface_run: beside this file

from minitron.training.argument_groups import ArgumentError  # noqa: E402
from minitron.training.arguments import GPT_ARGS_DEFAULTS, megatron_parser, validate_args  # noqa: E402
from minitron.training.tokenizer.tokenizer import TOKENIZER_TYPES  # noqa: E402
from surface_units import find_units  # noqa: E402

PATH_FLAGS = ("--data-path", "--train-data-path", "--valid-data-path", "--test-data-path", "--data-cache-path",
              "--vocab-file", "--merge-file", "--tokenizer-model", "--load", "--save", "--tensorboard-dir",
              "--wandb-save-dir", "--tokenizer-type", "--data-args-path", "--per-split-data-args-path")
# Launch scripts that Megatron-Core 0.19.2's own validate_args refuses as they are written (its
# megatron/training/arguments.py): minitron refusing them too is fidelity, and the totals say so.
MEGATRON_REFUSES = {
    "examples/gpt3/train_gpt3_175b_distributed.sh": "asserts 'Cannot specify both --step-batch-size-schedule and "
                                                    "--global-batch-size', and the script gives both",
    "examples/gptoss/02_train.sh": "asserts num_layers % pipeline size == 0: 12 layers on 8 stages",
}
# Flags without which validate_args cannot look further: a refusal naming one ends the retries.
CORE = ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--micro-batch-size")


# --- mock data, world -----------------------------------------------------------------------------
def _drop(argv: list[str], flags) -> list[str]:
    """argv without each of ``flags`` and the values that follow it."""
    out, skipping = [], False
    for word in argv:
        if word.startswith("--"):
            skipping = word.split("=")[0] in flags
        if not skipping:
            out.append(word)
    return out


def _value(argv: list[str], flag: str, default=None):
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return default


def mock(argv: list[str], scratch: str) -> list[str]:
    # A value that is still a CI placeholder (--seed ${REPEAT}: the CI driver sets it per repeat)
    # leaves the flag out: Megatron's default stands in, as for a path.
    argv = _drop(argv, [argv[i - 1] for i, w in enumerate(argv) if i and re.fullmatch(r"\$\{\w+\}", w)
                        and argv[i - 1].startswith("--") and argv[i - 1] not in PATH_FLAGS])
    kind = _value(argv, "--tokenizer-type")
    # a type minitron lacks is kept, to be refused by name; "${TOKENIZER_TYPE}" (CI's) is mock data
    keep_tokenizer = kind is not None and kind not in TOKENIZER_TYPES and "$" not in kind
    out = _drop(argv, [f for f in PATH_FLAGS if not (keep_tokenizer and f == "--tokenizer-type")])
    if "--mock-data" not in out:
        out.append("--mock-data")
    if not keep_tokenizer:
        out += ["--tokenizer-type", "NullTokenizer"]
    if "--save" in argv:
        out += ["--save", os.path.join(scratch, "save")]
    return out


def _int(argv, flag, default=1) -> int:
    try:
        return int(_value(argv, flag, default))
    except (TypeError, ValueError):
        return default


def world_of(argv: list[str], path: Path) -> int:
    tp, pp, cp = (_int(argv, f) for f in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                           "--context-parallel-size"))
    ep, etp = _int(argv, "--expert-model-parallel-size"), _int(argv, "--expert-tensor-parallel-size", tp)
    smallest = math.lcm(tp * cp, ep * etp) * pp
    # --num-distributed-optimizer-instances N splits dp x cp into N groups: the layout's smallest
    # world repeated until it does (Megatron's CI runs these cases on a node of 8)
    instances = _int(argv, "--num-distributed-optimizer-instances")
    smallest *= next(k for k in range(1, instances + 1) if (smallest * k // (tp * pp)) % instances == 0)
    nodes = re.search(r"(\d+)N(\d+)G|(\d+)nodes?", path.parent.name)
    if nodes:
        world = int(nodes[1]) * int(nodes[2]) if nodes[1] else 8 * int(nodes[3])
        if world % smallest == 0:
            return world
    return smallest


@contextmanager
def environment(env: dict):
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# --- verdicts -------------------------------------------------------------------------------------
def _blocking_flag(message: str, argv: list[str]) -> str | None:
    given = {w.split("=")[0] for w in argv if w.startswith("--")}
    return next((f for f in re.findall(r"--[\w-]+", message) if f in given), None)


def verdict(argv: list[str], world: int, env: dict) -> tuple[str | None, list[str]]:
    """(the first refusal or None, every flag that blocked) for one unit's mocked argv."""
    first, blockers = None, []
    with environment(env):
        for _ in range(60):
            try:
                args, unknown = megatron_parser().parse_known_args(argv)
                unknown = [w.split("=")[0] for w in unknown if w.startswith("--")]
                if unknown:
                    first = first or f"unknown to minitron: {' '.join(unknown)}"
                    blockers += unknown
                    argv = _drop(argv, unknown)
                    continue
                args.rank, args.world_size, args.distributed_backend = 0, world, "gloo"
                validate_args(args, dict(GPT_ARGS_DEFAULTS))
                return first, blockers
            except (ArgumentError, ValueError) as exc:
                message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                first = first or message
                flag = _blocking_flag(message, argv)
                if flag is None or flag in CORE:
                    blockers.append(flag or f"({message})")
                    return first, blockers
                blockers.append(flag)
                argv = _drop(argv, [flag])
    return first, blockers


def survey(root: Path) -> list[dict]:
    scratch = tempfile.mkdtemp(prefix="megatron-surface-")
    units = find_units(root)
    for unit in units:
        unit["world"] = world_of(unit["argv"], unit["path"])
        unit["reason"], unit["blockers"] = verdict(mock(unit["argv"], scratch), unit["world"], unit["env"])
    return units


def _megatron_refuses(unit: dict, root: Path) -> str | None:
    return MEGATRON_REFUSES.get(unit["path"].relative_to(root).as_posix())


def report(units: list[dict], root: Path, top: int, each: bool) -> str:
    lines = []
    if each:
        for u in units:
            name = u["path"].relative_to(root)
            tag = "hybrid " if u["hybrid"] else ""
            theirs = f" (Megatron 0.19.2 refuses it too: it {_megatron_refuses(u, root)})" \
                if u["blockers"] and _megatron_refuses(u, root) else ""
            lines.append(f"{tag}{u['kind']} {name} (world {u['world']}): "
                         + ("accepted" if not u["blockers"] else f"refused: {u['reason']}{theirs}"))
        lines.append("")
    for kind, label in (("script", "launch scripts"), ("model", "model configurations"), ("ci", "CI training cases")):
        for hybrid in (False, True):
            group = [u for u in units if u["kind"] == kind and u["hybrid"] == hybrid]
            if group:
                ok = sum(1 for u in group if not u["blockers"])
                theirs = [u for u in group if u["blockers"] and _megatron_refuses(u, root)]
                also = f" ({len(theirs)} more refused by Megatron 0.19.2 too)" if theirs else ""
                lines.append(f"{label}{' (hybrid)' if hybrid else ''}: {ok} accepted of {len(group)}{also}")
    counts = Counter(flag for u in units if not u["hybrid"] for flag in dict.fromkeys(u["blockers"]))
    lines.append(f"most frequent blockers (non-hybrid units each flag blocks), top {top}:")
    lines += [f"  {flag}: {n}" for flag, n in counts.most_common(top)]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron", required=True, type=Path, help="a Megatron-LM checkout (a work tree)")
    parser.add_argument("--units", action="store_true", help="one line per unit, then the totals")
    parser.add_argument("--top", type=int, default=15, help="how many blockers to list")
    parser.add_argument("--run", action="store_true", help="also run each accepted unit through estimate and "
                                                           "trace --backend fake at its world (minutes)")
    opts = parser.parse_args(argv)
    if not (opts.megatron / "examples").is_dir():
        parser.error(f"{opts.megatron} has no examples/: give the root of a Megatron-LM checkout")
    units = survey(opts.megatron)
    print(report(units, opts.megatron, opts.top, opts.units))
    if opts.run:
        from surface_run import run_accepted   # lazy: only --run pays for the commands' imports
        print("\n".join(run_accepted(units, opts.megatron, mock, environment)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
