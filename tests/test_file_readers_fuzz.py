"""The file readers under random damage: a valid world_info, hostfile, launch.json, ds_config
and checkpoint metadata, each with one value somewhere replaced by a random JSON value. Every
reader must either accept the result or refuse it with its own one-line error; any other
exception (a TypeError deep inside, a RecursionError) is the bug issue #25 found by hand.

A seeded generator rather than hypothesis (not a dependency here): the same 300 mutants of
each file on every run, in well under a second, and a failure names its seed.
"""

from __future__ import annotations

import base64
import copy
import json
import random

import pytest

from minitron.launcher.runner import ResourceError, _parse_hostfile, decode_world_info
from minitron.launcher.vscode import write_launch_json
from minitron.runtime import DeepSpeedConfig, DeepSpeedConfigError
from minitron.training.checkpoint_files import CheckpointError, check_metadata

SHARD = "mp_rank_00/model_optim_rng.pt"
VALID = {
    "world_info": {"localhost": [0, 1], "worker-1": [0]},
    "launch.json": {"version": "0.2.0", "configurations": [{"name": "mine", "type": "debugpy"}],
                    "compounds": [{"name": "both", "configurations": ["mine"]}]},
    "ds_config": {"train_batch_size": 16, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
                  "fp16": {"enabled": True, "initial_scale_power": 12, "min_loss_scale": 1},
                  "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "adam_w_mode": False}},
                  "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
                  "zero_optimization": {"stage": 2, "reduce_bucket_size": 1000}},
    "metadata": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "data_parallel_size": 2,
                 "files": {SHARD: {"bytes": 10, "sha256": "0" * 64}}},
}


def random_value(rng: random.Random, depth: int = 0):
    kinds = ["int", "float", "str", "bool", "null", "inf", "big"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "dict":
        return {rng.choice(["", "name", "0", "files", "stage"]): random_value(rng, depth + 1)
                for _ in range(rng.randint(0, 3))}
    return {"int": lambda: rng.choice([0, -1, 1, 7, 2**40]), "float": lambda: rng.choice([0.5, 1.0, -2.5, 1e30]),
            "str": lambda: rng.choice(["", "x", "0", "adam", "../x.pt"]), "bool": lambda: rng.random() < 0.5,
            "null": lambda: None, "inf": lambda: rng.choice([float("inf"), float("nan")]),
            "big": lambda: 10**300}[kind]()


def mutant(valid, rng: random.Random):
    """``valid`` with one node (a value, a list item or the whole) replaced at random."""
    tree = copy.deepcopy(valid)
    places = []

    def walk(node):
        for key in (range(len(node)) if isinstance(node, list) else list(node) if isinstance(node, dict) else ()):
            places.append((node, key))
            walk(node[key])
    walk(tree)
    if not places or rng.random() < 0.05:
        return random_value(rng)
    node, key = rng.choice(places)
    node[key] = random_value(rng)
    return tree


def check_world_info(value, tmp_path):
    decode_world_info(base64.urlsafe_b64encode(json.dumps(value).encode()).decode())


def check_launch_json(value, tmp_path):
    path = tmp_path / "launch.json"
    path.write_text(json.dumps(value))
    write_launch_json(path, 2, 5678)


def check_ds_config(value, tmp_path):
    if isinstance(value, dict):
        DeepSpeedConfig(value, world_size=2)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(value))
    DeepSpeedConfig(path, world_size=2)


def check_metadata_file(value, tmp_path):
    if not isinstance(value, dict):
        return  # read_metadata refuses a non-object before the schema
    check_metadata(value, tmp_path / "metadata.json")


READERS = {"world_info": (check_world_info, ResourceError), "launch.json": (check_launch_json, ValueError),
           "ds_config": (check_ds_config, DeepSpeedConfigError), "metadata": (check_metadata_file, CheckpointError)}


@pytest.mark.parametrize("name", READERS)
def test_one_damaged_value_is_accepted_or_one_line(name, tmp_path):
    reader, error = READERS[name]
    for seed in range(300):
        value = mutant(VALID[name], random.Random(seed))
        try:
            reader(value, tmp_path)
        except error as exc:
            assert "\n" not in str(exc) and str(exc), (seed, value, str(exc))
        except Exception as exc:  # noqa: BLE001 -- the failure this test looks for
            pytest.fail(f"seed {seed}: {type(exc).__name__}: {exc} for {json.dumps(value)[:300]}")


@pytest.mark.parametrize("seed", range(200))
def test_hostfile_lines(seed):
    rng = random.Random(seed)
    lines = [rng.choice(["localhost slots=2", "worker-1 slots=0", "# c", "", "x slots=", "y slots=99999",
                         "z  slots=3 extra", "slots=1", "h slots=-1", "h\tslots=1"]) for _ in range(rng.randint(0, 4))]
    try:
        _parse_hostfile(lines)
    except ResourceError as exc:
        assert "\n" not in str(exc)
