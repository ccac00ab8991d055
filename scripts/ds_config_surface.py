"""How much of DeepSpeed 0.19.8's ds_config surface minitron takes: a generated battery of
ds_configs (ds_config_battery.py, ds_config_full.py) through minitron's DeepSpeedConfig, in this
process, and through DeepSpeed's own, in DeepSpeed's interpreter (ds_config_surface_peer.py).

    .venv/bin/python scripts/ds_config_surface.py --deepspeed-python /tmp/vds/bin/python \\
        [--units] [--json docs/ds-config-surface.json]

minitron's side is what `minitron pretrain --deepspeed --deepspeed-config`, `minitron ds-config`
and `minitron estimate` read a ds_config with: minitron.runtime.DeepSpeedConfig(path,
world_size=dp). Both sides read the same files at data-parallel size 2. A disagreement is one of

  unknown key      DeepSpeed accepts a key it does not know (it ignores it); minitron refuses
                   it on purpose, naming the key and the nearest one it reads;
  bad value        DeepSpeed accepts a value of the wrong kind or range because nothing reads
                   it before a step (a string steps_per_print); minitron refuses it at once;
  missing feature  a real DeepSpeed key, value or type minitron does not run: the list to read;
  minitron bug     minitron accepts what DeepSpeed refuses;
  kept             minitron accepts what DeepSpeed 0.19.8 refuses because 0.19.7 removed it, on
                   purpose (KEPT: 1-bit Adam, run as 0.19.6 ran it).

The class comes from what each config was built to be (its kind), not from the refusal's text.
Nothing is written into the repository but the --json summary the chapter prints.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))   # the battery modules and the peer script: beside this file

from ds_config_battery import DP, KEYS, battery  # noqa: E402

CLASSES = {"unknown": "unknown key DeepSpeed ignores (minitron's deliberate strictness)",
           "bad": "bad value DeepSpeed lets through (minitron checks it at once)",
           "feature": "a DeepSpeed feature minitron lacks",
           "bug": "accepted by minitron, refused by DeepSpeed (a minitron bug)",
           "kept": "accepted by minitron, refused by DeepSpeed 0.19.8, which removed it (KEPT says why)",
           "later": "refused by both, by DeepSpeed only once a model is built (refused_later says where)"}

# Configs DeepSpeed refuses too, but only where the peer cannot look without a model: 16-bit
# master weights (fp16's, or bf16's with fp32 optimizer states) need ZeRO-Offload with
# DeepSpeedCPUAdam, which runtime/zero/stage_1_and_2.py's _enforce_cpu_offload asserts when it
# builds the ZeRO optimizer over the model's parameters.
def refused_later(config: dict) -> bool:
    fp16, bf16 = config.get("fp16") or {}, config.get("bf16") or {}
    master = fp16.get("fp16_master_weights_and_grads") is True or \
        (bf16.get("bf16_master_weights_and_grads") is True and bf16.get("bf16_optimizer_states") is not True)
    zero = config.get("zero_optimization") or {}
    offload = (zero.get("offload_optimizer") or {}).get("device")
    cpu_adam = str((config.get("optimizer") or {}).get("type", "")).lower() in ("adam", "adamw")
    # The engine's _configure_zero_optimizer raises for legacy_stage1 under ZeRO, and the ZeRO-1/2
    # optimizer's constructor for compute_grad_norm false with clipping (1.0 by default) or offload.
    stage = zero.get("stage", 0)
    legacy = zero.get("legacy_stage1") is True and stage in (1, 2, 3)
    clip = config.get("gradient_clipping", 1.0)
    no_norm = zero.get("compute_grad_norm") is False and stage in (1, 2) and (
        isinstance(clip, (int, float)) and clip > 0 or offload in ("cpu", "nvme"))
    return master and not (offload == "cpu" and cpu_adam) or legacy or no_norm

# What DeepSpeed 0.19.7 removed and minitron keeps on purpose, as the last release that had it
# (0.19.6) ran it: the optimizer type, and why.
KEPT = {"OneBitAdam": "1-bit Adam, removed in DeepSpeed 0.19.7; minitron runs 0.19.6's to teach it (chapter 14)"}


def kept(config: dict) -> bool:
    return str((config.get("optimizer") or {}).get("type", "")) in KEPT


# every key and section the battery tries as DeepSpeed's own
DEEPSPEED_KEYS = {key for _, key, *_ in KEYS} | {part for section, *_ in KEYS for part in section.split(".") if part}


def write_battery(folder: Path) -> list[dict]:
    """Each config as folder/NNN.json (a file, as users give it), with its name and kind."""
    units = []
    for i, (name, kind, config) in enumerate(battery()):
        path = folder / f"{i:04d}.json"
        path.write_text(json.dumps(config))
        units.append({"file": path.name, "path": path, "name": name, "kind": kind, "config": config})
    return units


def minitron_verdict(path: Path) -> str | None:
    """None if minitron's DeepSpeedConfig takes the file, else its refusal's one line. Anything but
    a DeepSpeedConfigError would be a traceback for the user: reported as a crash."""
    from minitron.runtime import DeepSpeedConfig   # lazy: --from-json needs none of minitron
    from minitron.runtime.config_values import DeepSpeedConfigError
    try:
        DeepSpeedConfig(path, world_size=DP)
    except DeepSpeedConfigError as exc:
        return str(exc).splitlines()[0]
    except Exception as exc:   # noqa: BLE001 -- the point is to see it
        return f"CRASH {type(exc).__name__}: {exc}"
    return None


def deepspeed_verdicts(python: str, folder: Path) -> dict:
    """file -> DeepSpeed's verdict, from one child of DeepSpeed's interpreter."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0", "PYTHONPATH": ""}
    child = subprocess.run([python, str(HERE / "ds_config_surface_peer.py"), str(folder), str(DP)],
                           capture_output=True, text=True, env=env, timeout=3600)
    if child.returncode != 0:
        sys.exit(f"DeepSpeed's side failed (exit {child.returncode}): {child.stderr.strip().splitlines()[-1:]}")
    lines = [json.loads(line) for line in child.stdout.splitlines() if line.startswith('{"file"')]
    return {v["file"]: v for v in lines}


def classify(unit: dict) -> str | None:
    ours, theirs = unit["minitron"], unit.get("deepspeed")
    if theirs is None:
        return None
    if ours is None and not theirs["accepted"]:
        return "kept" if kept(unit["config"]) else "bug"
    if ours is not None and theirs["accepted"]:
        if refused_later(unit["config"]):
            return "later"
        named = re.search(r"unknown key '(\w+)'", ours)
        if unit["kind"] == "full" and named and named[1] not in DEEPSPEED_KEYS:
            return "unknown"   # a whole config carrying a key DeepSpeed does not have (aio's old thread_count)
        return {"unknown": "unknown", "bad": "bad"}.get(unit["kind"], "feature")
    return None


def survey(python: str | None, units_only: list | None = None) -> list[dict]:
    folder = Path(tempfile.mkdtemp(prefix="ds-config-surface-"))
    units = write_battery(folder)
    if units_only is not None:
        units = [u for u in units if u["name"] in units_only]
    for unit in units:
        unit["minitron"] = minitron_verdict(unit["path"])
    if python:
        theirs = deepspeed_verdicts(python, folder)
        for unit in units:
            unit["deepspeed"] = theirs[unit["file"]]
            unit["class"] = classify(unit)
    return units


def totals(units: list[dict]) -> dict:
    out = {"configs": len(units), "data_parallel_size": DP,
           "kinds": dict(Counter(u["kind"] for u in units)),
           "minitron_accepts": sum(u["minitron"] is None for u in units)}
    if units and "deepspeed" in units[0]:
        out["deepspeed_accepts"] = sum(u["deepspeed"]["accepted"] for u in units)
        out["deepspeed_refuses_at_initialize"] = sum(not u["deepspeed"]["accepted"] and
                                                     u["deepspeed"]["stage"] == "initialize" for u in units)
        out["both_accept"] = sum(u["minitron"] is None and u["deepspeed"]["accepted"] for u in units)
        out["both_refuse"] = sum(u["minitron"] is not None and not u["deepspeed"]["accepted"] for u in units) \
            + sum(u["class"] == "later" for u in units)
        out["deepspeed_accepts_minitron_refuses"] = sum(u["class"] in ("unknown", "bad", "feature") for u in units)
        out["classes"] = {c: sum(u["class"] == c for u in units) for c in CLASSES}
        out["missing_features"] = [{"config": u["name"], "minitron": short(u["minitron"])}
                                   for u in units if u["class"] == "feature"]
        out["minitron_bugs"] = [{"config": u["name"], "deepspeed": u["deepspeed"]["reason"]}
                                for u in units if u["class"] == "bug"]
        out["kept"] = [{"config": u["name"], "why": KEPT[u["config"]["optimizer"]["type"]]}
                       for u in units if u["class"] == "kept"]
    return out


def report(units: list[dict], each: bool) -> str:
    lines = []
    if each:
        for u in units:
            ours = "accepted" if u["minitron"] is None else f"refused: {u['minitron']}"
            theirs = ""
            if "deepspeed" in u:
                d = u["deepspeed"]
                theirs = " | DeepSpeed " + ("accepted" if d["accepted"] else f"refused at {d['stage']}: {d['reason']}")
            lines.append(f"[{u['kind']}] {u['name']}: minitron {ours}{theirs}")
        lines.append("")
    lines += summary(totals(units))
    for c in ("feature", "bug", "kept", "bad", "unknown") if "deepspeed" in (units or [{}])[0] else ():
        group = [u for u in units if u["class"] == c]
        if group:   # one line per refusal, then the configs it refused
            lines.append(f"\n{CLASSES[c]}:")
            by_reason: dict = {}
            for u in group:
                why = short(u["minitron"]) if c not in ("bug", "kept") else f"DeepSpeed: {u['deepspeed']['reason']}"
                by_reason.setdefault(why, []).append(u["name"])
            for why, names in by_reason.items():
                lines.append(f"  {why}\n      {', '.join(names)}")
    return "\n".join(lines)


def summary(t: dict) -> list[str]:
    """The totals, from a live survey or from the --json file the chapter prints them from."""
    lines = [f"{t['configs']} ds_configs at data-parallel size {t['data_parallel_size']}",
             f"  by kind: {', '.join(f'{n} {k}' for k, n in t['kinds'].items())}",
             f"minitron accepts {t['minitron_accepts']}"]
    if "deepspeed_accepts" in t:
        lines.append(f"DeepSpeed 0.19.8 accepts {t['deepspeed_accepts']} (and refuses "
                     f"{t['deepspeed_refuses_at_initialize']} more only at deepspeed.initialize)")
        lines.append(f"both accept {t['both_accept']}, both refuse {t['both_refuse']} ({t['classes']['later']} of "
                     f"them refused by DeepSpeed only once a model is built)")
        lines.append(f"accepted by DeepSpeed, refused by minitron: {t['deepspeed_accepts_minitron_refuses']}")
        for c, label in list(CLASSES.items())[:5]:
            lines.append(f"  {t['classes'][c]:>4}  {label}")
    return lines


def short(refusal: str) -> str:
    """A refusal without the list of every key minitron reads (the key it names is the point)."""
    return refusal.split("; minitron reads ")[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deepspeed-python", help="the interpreter of a venv with DeepSpeed 0.19.8 (without it, "
                                                   "minitron's side only)")
    parser.add_argument("--units", action="store_true", help="one line per config, then the totals")
    parser.add_argument("--json", type=Path, help="also write the totals and both lists to this file")
    parser.add_argument("--from-json", type=Path, help="print the totals a --json run wrote, running nothing")
    opts = parser.parse_args(argv)
    if opts.from_json:
        try:
            print("\n".join(summary(json.loads(opts.from_json.read_text()))))
        except (OSError, ValueError, KeyError) as exc:
            parser.error(f"--from-json {opts.from_json}: not a file this script's --json wrote ({exc})")
        return 0
    if opts.deepspeed_python and not Path(opts.deepspeed_python).is_file():
        parser.error(f"--deepspeed-python {opts.deepspeed_python}: no such file; give a venv's bin/python")
    if opts.json and not opts.deepspeed_python:
        parser.error("--json writes the comparison: give --deepspeed-python too")
    units = survey(opts.deepspeed_python)
    print(report(units, opts.units))
    if opts.json:
        opts.json.write_text(json.dumps(totals(units), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
