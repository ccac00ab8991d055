"""Megatron-LM's example launch scripts (tests/example_scripts.py) through `minitron estimate`
and `minitron trace --backend fake --ranks`: the table below is the honest record of what each
one does here. A row flips when minitron learns a flag, and this test then says which.

A script "runs" when both commands accept every flag and print their answer; it is "refused"
when both stop at the same flag, in one line, naming the flag and why. The trace plays three
ranks of the script's world (0, the middle one and the last), each on its own, initialization
only: a script's own run length (500,000 iterations) is validated and then not run.

Both commands run in pytest's process (tests/cli_here.py): the whole table costs about a
second, where fresh interpreters would cost ~0.5 s a refusal and ~2 s a trace.
"""

from __future__ import annotations

import re

import pytest

from example_scripts import ALL
from cli_here import run_minitron

RUNS = "runs"
# the trace runs initialization and warns that a training step of the flags would be refused
RUNS_WARNED = "runs, with the warning"
# script (or variant) -> RUNS, or (the flag it stops at, words of the reason)
EXPECTED = {
    "gpt3_175b": ("--step-batch-size-schedule", "drop --global-batch-size (Megatron: cannot specify both)"),
    "gpt3_175b_schedule": ("--step-batch-size-schedule", "train with --train-samples N instead of --train-iters"),
    "llama3_8b": RUNS,   # fp8 hybrid, delayed, with --fp8-param-gather under the distributed optimizer
    "llama3_8b_bf16": RUNS,
    "mixtral_8x7b": RUNS,   # gated experts, --load with --no-load-optim --no-load-rng: all taken
    # 12 layers on the 8 pipeline stages the script asks for (PP_SIZE = its world): Megatron 0.19.2
    # refuses that too ("Number of layers should be divisible by the pipeline-model-parallel size")
    "gpt_oss": ("--num-layers 12", "not divisible by --pipeline-model-parallel-size 8"),
    "deepseek_v2_lite": RUNS,   # MLA's default rope, YaRN with --rotary-scaling-factor 40, as in Megatron
    # MoE at tp 4 without --sequence-parallel: Megatron sets it up (warning) and its MoE layer
    # raises at the first training forward; estimate predicts a step, the trace initializes only
    "qwen3_30b_a3b": {"estimate": ("--sequence-parallel", "Megatron's MoE layer raises at its first training"),
                      "trace": RUNS_WARNED},
    "llama3p1_8b_instruct": RUNS,   # --add-qkv-bias: linear_qkv's bias alone
}


def _played(world: int) -> str:
    return f"0,{world // 2},{world - 1}"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every script through both commands, each in this process (tests/cli_here.py): a refusal
    costs ~20 ms so, and a fake trace forks its players from here, as test_exercises' commands
    do, instead of paying ~2 s for a fresh interpreter's torch. {(name, command): outcome}."""
    tmp = tmp_path_factory.mktemp("scripts")
    done = {}
    for name, script in ALL.items():
        argv = script.argv(tmp)
        done[name, "estimate"] = run_minitron("estimate", "--world", script.world, *argv, here=True)
        done[name, "trace"] = run_minitron("trace", "--backend", "fake", "--world", script.world, "--ranks",
                                           _played(script.world), "--out", tmp / f"trace-{name}", *argv, here=True)
    return done


def test_the_table_covers_every_script():
    assert set(EXPECTED) == set(ALL)


def _runs(name, command, outcome) -> list[str]:
    """What a command that runs a script must print (empty: it did)."""
    script = ALL[name]
    if outcome.returncode != 0:
        return [f"{name} {command} was recorded as running: {outcome.stderr.strip()}"]
    # estimate: Megatron's FLOP count for the script's own batch; trace: the chosen ranks, alone
    batch = script.argv("x")[script.argv("x").index("--global-batch-size") + 1]
    wanted = {"estimate": [rf"compute: [\d.]+ [PE]FLOP per iteration, [\d,]+ tokens \({batch} × "],
              "trace": [re.escape(f"3 of {script.world} ranks (fake"), "initialization only: the flags ask for"]}
    found = [f"{name}: no {pattern!r} in its {command} output" for pattern in wanted[command]
             if not re.search(pattern, outcome.stdout)]
    if command == "trace":
        warned = "a training step (--steps N) would be refused" in outcome.stdout
        recorded = isinstance(EXPECTED[name], dict) and EXPECTED[name]["trace"] == RUNS_WARNED
        if warned != recorded:
            found.append(f"{name}: the trace {'printed' if warned else 'did not print'} the warning that a "
                         f"training step would be refused, which the table {'does not record' if warned else 'records'}")
    return found + ([f"{name}: a check failed across the played ranks"] if "✗" in outcome.stdout else [])


def _problems(name, estimate, trace) -> list[str]:
    """How the two commands' outcomes differ from the table's row (empty: as recorded)."""
    expected = EXPECTED[name]
    per_command = expected if isinstance(expected, dict) else {"estimate": expected, "trace": expected}
    found = []
    for (command, want), outcome in zip(per_command.items(), (estimate, trace)):
        if want in (RUNS, RUNS_WARNED):
            found += _runs(name, command, outcome)
            continue
        flag, words = want
        lines = outcome.stderr.strip().splitlines()
        if not (outcome.returncode == 2 and len(lines) == 1 and flag in lines[0] and words in lines[0]):
            found.append(f"{name} {command}: expected one line naming {flag} ({words!r}), exit 2; got exit "
                         f"{outcome.returncode}: {outcome.stderr.strip()[:300]!r}")
    if expected != RUNS and not isinstance(expected, dict) and \
            estimate.stderr != trace.stderr.replace("trace --help", "estimate --help"):
        found.append(f"{name}: estimate and trace refuse in different words")
    return found


def test_each_script_does_what_the_table_says(outcomes):
    # One test for all rows: pytest-xdist would run the module fixture again in each worker
    # that got a row of a parametrized test.
    problems = [p for name in EXPECTED for p in _problems(name, outcomes[name, "estimate"], outcomes[name, "trace"])]
    assert not problems, "\n".join(problems)
