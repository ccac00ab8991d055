"""Bad files and values for the commands that read them (issues #25, #29, #26): launch's
--world_info, hostfile and core list; vscode's launch.json; preprocess's corpus and prefix;
ds-config's values; pretrain --load's metadata and shards. Each is one line, exit code 2,
nothing left running, and (unless the row says torch) refused before torch was imported. A
row that needs torch runs in this process (which has it), so they are few: the same checks in
more variants run in-process in test_data_preprocess.py and test_runtime_config.py.

One table, run by tests/refusals.py in a torch-free interpreter (a few rows forked one child
each, the rest one after another in it). The
files every row reads are written once, into one folder, by ``made`` below; a row's argv
names them as {d}/NAME (tests/bad_files.py writes them). The values DeepSpeed 0.19.8 accepts (ACCEPTED) run the same way and
must resolve to DeepSpeed's value.
"""

from __future__ import annotations

import base64
import json
import os

import pytest

from bad_files import write_checkpoints, write_files
from cli_here import minitron_here
from refusals import Case, Outcome, run_cases

TINY = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
        "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "2", "--lr", "1e-3",
        "--mock-data", "--vocab-size", "64"]
SHARD = "mp_rank_00/model_optim_rng.pt"
DEEP = "[" * 10000 + "]" * 10000


def b64(value) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


def world_info(value, label: str):
    return (f"world_info {label}", ["launch", "--world_info", b64(value), "--dry-run", "x.py"], ["--world_info"])


def hostfile(name: str, text: str, words: list):
    return (f"hostfile {name}", ["launch", "--hostfile", f"{{d}}/hosts-{name}", "--dry-run", "x.py"], words,
            {f"hosts-{name}": text})


def cores(listed: str, words: list):
    return (f"core list {listed!r}", ["launch", "--world", "2", "--bind_cores_to_rank", "--bind_core_list", listed,
                                      "--dry-run", "x.py"], ["--bind_core_list", *words])


def launch_json(name: str, content, words: list):
    text = content if isinstance(content, str) else json.dumps(content)
    return (f"launch.json {name}", ["vscode", "--world", "2", "--path", f"{{d}}/vscode-{name}/launch.json"],
            ["launch.json", *words], {f"vscode-{name}/launch.json": text})


def ds(name: str, config, words: list):
    text = config if isinstance(config, str) else json.dumps(config)
    return (f"ds_config {name}", ["ds-config", f"{{d}}/ds-{name}.json"], words, {f"ds-{name}.json": text})


def tb(**zero_or_more) -> dict:
    return {"train_batch_size": 8, **zero_or_more}


def preprocess(name: str, corpus: str | None, extra: list, words: list, torch: bool = False):
    argv = ["preprocess", "--input", f"{{d}}/corpus-{name}.jsonl" if corpus is not None else "{d}/ok.jsonl",
            "--output-prefix", "{d}/out", *extra]
    return (f"preprocess {name}", argv, words, {f"corpus-{name}.jsonl": corpus} if corpus is not None else {}, torch)


def load(name: str, words: list, torch: bool = False):
    return (f"load {name}", ["pretrain", "--world", "1", "--log-dir", "{d}/logs", *TINY, "--load", f"{{d}}/ck-{name}"],
            [f"ck-{name}", *words], {}, torch)


# A torch_dist checkpoint's metadata.json (no files listed: nothing to checksum) for a 3-layer,
# 2-head model, and the same as a legacy one: what `ckpt` reads before anything else.
CKD = {"sharded_backend": "torch_dist", "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
       "data_parallel_size": 1, "world_size": 1, "num_layers": 3, "hidden_size": 16, "num_attention_heads": 2,
       "seq_length": 16, "max_position_embeddings": 16, "vocab_size": 64}
CKD_FILES = {"ckd/latest_checkpointed_iteration.txt": "2", "ckd/iter_0000002/metadata.json": json.dumps(CKD),
             "ckd-legacy/latest_checkpointed_iteration.txt": "2",
             "ckd-legacy/iter_0000002/metadata.json": json.dumps({k: v for k, v in CKD.items()
                                                                  if k != "sharded_backend"})}


def ckpt(name: str, argv: list, words: list):
    return (f"ckpt {name}", ["ckpt", *argv], words, CKD_FILES)


ROWS = [
    # --- launch: --world_info is a schema, not whatever json.loads returns -------------------
    *[world_info(v, label) for v, label in [
        ([], "[]"), ({}, "{}"), (5, "5"), ("localhost", "a string"), (None, "null"), (True, "true"),
        ({"localhost": 5}, "slots a number"), ({"localhost": None}, "slots null"),
        ({"localhost": {"0": 0}}, "slots an object"), ({"localhost": "0,1"}, "slots a string"),
        ({"localhost": []}, "no slots"), ({"localhost": ["0", "1"]}, "slots as strings"),
        ({"localhost": [0, 0]}, "a slot twice"), ({"localhost": [-1]}, "a negative slot"),
        ({"localhost": [True]}, "a boolean slot"), ({"localhost": [1.5]}, "a fractional slot"),
        ({"localhost": [4096]}, "slot 4096"), ({"localhost": list(range(5000))}, "5000 slots"),
        ({"": [0]}, "an empty host"), ({" ": [0]}, "a blank host"),
        ({"localhost": [0], "worker-1": 2}, "a second host's slots a number")]],
    ("world_info deep", ["launch", "--world_info", base64.urlsafe_b64encode(DEEP.encode()).decode(), "--dry-run",
                         "x.py"], ["--world_info"]),
    ("world_info not base64", ["launch", "--world_info", "!!!", "--dry-run", "x.py"], ["--world_info"]),
    ("world_info not JSON", ["launch", "--world_info", base64.urlsafe_b64encode(b"hosts").decode(), "--dry-run",
                             "x.py"], ["--world_info"]),
    ("world_info not UTF-8", ["launch", "--world_info", base64.urlsafe_b64encode(b"\xff\xfe").decode(),
                              "--dry-run", "x.py"], ["--world_info"]),
    # --- launch: hostfiles, core lists and sizes that would take gigabytes --------------------
    hostfile("huge", "localhost slots=1000000000\n", ["slots", "4096"]),
    hostfile("5000-digits", "localhost slots=1" + "0" * 5000 + "\n", ["slots", "4096"]),
    hostfile("no-slots", "localhost\n", ["HOST slots=N"]),
    hostfile("word-slots", "localhost slots=four\n", ["HOST slots=N"]),
    hostfile("twice", "localhost slots=1\nlocalhost slots=2\n", ["appears twice"]),
    hostfile("empty", "", ["no hosts"]),
    hostfile("comments", "# nothing\n", ["no hosts"]),
    hostfile("not-utf8", "\udcff", ["UTF-8"]),
    ("hostfile of 80 MiB", ["launch", "--hostfile", "{d}/hosts-huge-file", "--dry-run", "x.py"],
     ["hosts-huge-file", "80 MiB is no hostfile"]),
    ("hostfile a folder", ["launch", "--hostfile", "{d}", "--dry-run", "x.py"], ["--hostfile", "no such file"]),
    cores("0-1000000000", ["more cores than"]), cores("0-8192", ["more cores than"]),
    cores("0-3,4-100000", ["more cores than"]), cores("a-b", ["'a-b'"]), cores("3-1", ["ascending"]),
    cores("1,1", ["ascending"]), cores("-1", ["'-1'"]), cores("", ["''"]), cores("0-" + "9" * 5000, ["core number"]),
    ("num_gpus huge", ["launch", "--num_gpus", "1000000000", "--dry-run", "x.py"], ["--num_gpus", "4096"]),
    ("world huge", ["launch", "--world", "1000000000", "--dry-run", "x.py"], ["--world 1000000000", "4096"]),
    ("world huge with include", ["launch", "--world", "1000000000", "--include", "localhost", "--dry-run", "x.py"],
     ["--world", "4096"]),
    ("world zero dry run", ["launch", "--world", "0", "--dry-run", "x.py"], ["--world must be at least 1"]),
    # --- vscode: the user's launch.json, read as VS Code's schema has it ---------------------
    launch_json("name-list", {"configurations": [{"name": ["a"]}]}, ["configurations[0].name", "array"]),
    launch_json("name-object", {"configurations": [{"name": {"a": 1}}]}, ["configurations[0].name", "object"]),
    launch_json("name-number", {"configurations": [{"name": 5}]}, ["configurations[0].name", "number"]),
    launch_json("name-null", {"configurations": [{"name": None}]}, ["configurations[0].name", "null"]),
    launch_json("name-bool", {"configurations": [{"name": True}]}, ["configurations[0].name", "boolean"]),
    launch_json("entry-number", {"configurations": [{"name": "mine"}, 5]}, ["configurations[1]", "number"]),
    launch_json("entry-string", {"configurations": ["x"]}, ["configurations[0]", "string"]),
    launch_json("entry-null", {"configurations": [None]}, ["configurations[0]", "null"]),
    launch_json("entry-list", {"configurations": [[{"name": "x"}]]}, ["configurations[0]", "array"]),
    launch_json("compound-name-list", {"compounds": [{"name": [1]}]}, ["compounds[0].name", "array"]),
    launch_json("compound-entry-number", {"compounds": [7]}, ["compounds[0]", "number"]),
    launch_json("configurations-string", {"configurations": "x"}, ['"configurations" is not a list']),
    launch_json("compounds-number", {"compounds": 5}, ['"compounds" is not a list']),
    launch_json("top-list", [], ["JSON list"]),
    launch_json("top-number", "5", ["JSON int"]),
    launch_json("deep", DEEP, ["nested too deeply"]),
    launch_json("deep-in-entry", '{"configurations": [{"name": "x", "a": ' + DEEP + "}]}", ["nested too deeply"]),
    launch_json("name-clash", {"configurations": [{"name": "minitron rank 0"}]}, ["'minitron rank 0'"]),
    launch_json("cut-short", '{"configurations": [', ["cannot read"]),
    ("vscode empty host", ["vscode", "--world", "2", "--debug-host", "", "--path", "{d}/v/launch.json"],
     ["--debug-host ''"]),
    ("vscode blank host", ["vscode", "--world", "2", "--debug-host", "  ", "--path", "{d}/v/launch.json"],
     ["--debug-host"]),
    ("vscode host with a space", ["vscode", "--world", "2", "--debug-host", "a b", "--path", "{d}/v/launch.json"],
     ["--debug-host"]),
    ("vscode port beyond 65535", ["vscode", "--world", "2", "--debug-port-base", "65535", "--path",
                                  "{d}/v/launch.json"], ["--debug-port-base 65535"]),
    ("vscode port 0", ["vscode", "--world", "2", "--debug-port-base", "0", "--path", "{d}/v/launch.json"],
     ["--debug-port-base 0"]),
    ("vscode world 0", ["vscode", "--world", "0", "--path", "{d}/v/launch.json"], ["--world"]),
    # --- preprocess ------------------------------------------------------------------------------
    preprocess("prefix-empty", None, ["--output-prefix", ""], ["--output-prefix ''", "no file name"]),
    preprocess("prefix-folder", None, ["--output-prefix", "{d}/sub/"], ["--output-prefix", "no file name"]),
    preprocess("prefix-dot", None, ["--output-prefix", "."], ["--output-prefix '.'"]),
    # A corpus's first batch of lines is read and tokenized before torch, the output files, the
    # progress bar or a worker (test_data_preprocess.py checks that none starts): refused at once.
    preprocess("null-id-70000", '{"text": "1 2 70000"}\n', ["--tokenizer-type", "NullTokenizer", "--vocab-size", "100"],
               [":1:", "token id 70000", "vocabulary"]),
    preprocess("deep-workers", '{"text": "a"}\n' + DEEP + "\n", ["--workers", "2"], [":2:", "nested too deeply"]),
    preprocess("line-1-not-json", '{"text": \n{"text": "ok"}\n', [], [":1:", "not valid JSON"]),
    preprocess("line-1-not-json-workers", '{"text": \n{"text": "ok"}\n', ["--workers", "2"], [":1:", "not valid JSON"]),
    preprocess("line-1-no-text", '{"body": "x"}\n', ["--workers", "2"], [":1:", "no string under key 'text'"]),
    ("preprocess line over 64 MiB", ["preprocess", "--input", "{d}/one-line.jsonl", "--output-prefix", "{d}/out"],
     [":1:", "64 MiB"]),
    # --- ds-config: DeepSpeed 0.19.8 refuses these too (or they could not be run) -------------
    ds("clip-infinity", '{"train_batch_size": 8, "gradient_clipping": Infinity}', ["gradient_clipping", "finite"]),
    ds("clip-minus-infinity", '{"train_batch_size": 8, "gradient_clipping": -Infinity}', ["gradient_clipping"]),
    ds("clip-nan", '{"train_batch_size": 8, "gradient_clipping": NaN}', ["gradient_clipping", "NaN"]),
    ds("clip-1e400", '{"train_batch_size": 8, "gradient_clipping": 1e400}', ["gradient_clipping", "finite"]),
    ds("clip-string", tb(gradient_clipping="1.0"), ["gradient_clipping"]),
    ds("clip-bool", tb(gradient_clipping=True), ["gradient_clipping"]),
    ds("lr-infinity", '{"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": Infinity}}}',
       ["optimizer.params.lr", "finite"]),
    ds("lr-negative", tb(optimizer={"type": "Adam", "params": {"lr": -1}}), ["optimizer.params.lr"]),
    ds("eps-nan", '{"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"eps": NaN}}}', ["eps"]),
    ds("betas-infinity", '{"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9, Infinity]}}}',
       ["betas"]),
    ds("optimizer-sgd", tb(optimizer={"type": "sgd"}), ["optimizer.type"]),
    ds("optimizer-number", tb(optimizer={"type": 5}), ["optimizer.type"]),
    ds("scheduler-lowercase", tb(scheduler={"type": "warmuplr"}), ["scheduler.type"]),
    ds("warmup-steps-0", tb(scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 0}}), ["warmup_num_steps"]),
    ds("warmup-max-lr-inf", '{"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": '
       'Infinity}}}', ["warmup_max_lr"]),
    ds("batch-1e30", '{"train_batch_size": 1e30}', ["train_batch_size", "whole number", "float"]),
    ds("batch-8.5", '{"train_batch_size": 8.5}', ["train_batch_size", "whole number"]),
    ds("batch-string", tb(train_batch_size="8"), ["train_batch_size", "whole number"]),
    ds("batch-bool", tb(train_batch_size=True), ["train_batch_size"]),
    ds("batch-zero", tb(train_batch_size=0), ["Train batch size: 0"]),
    ds("batch-5000-digits", '{"train_batch_size": 1' + "0" * 5000 + "}", ["4300 digits"]),
    ds("micro-infinity", '{"train_micro_batch_size_per_gpu": Infinity}', ["train_micro_batch_size_per_gpu"]),
    ds("steps-per-print-0", tb(steps_per_print=0), ["steps_per_print"]),
    ds("stage-1.5", tb(zero_optimization={"stage": 1.5}), ["zero_optimization.stage"]),
    ds("stage-word", tb(zero_optimization={"stage": "one"}), ["zero_optimization.stage"]),
    ds("stage-4", tb(zero_optimization={"stage": 4}), ["zero_optimization.stage"]),
    ds("stage-list", tb(zero_optimization={"stage": [1]}), ["zero_optimization.stage"]),
    ds("scale-power-1024", tb(fp16={"enabled": True, "initial_scale_power": 1024}), ["initial_scale_power", "127"]),
    ds("scale-power-5000", tb(fp16={"enabled": True, "initial_scale_power": 5000}), ["initial_scale_power", "127"]),
    ds("scale-power-1.5", tb(fp16={"enabled": True, "initial_scale_power": 1.5}), ["initial_scale_power"]),
    ds("scale-power-minus-1000", tb(fp16={"enabled": True, "initial_scale_power": -1000}), ["initial_scale_power"]),
    ds("min-loss-scale-0.5", tb(fp16={"enabled": True, "min_loss_scale": 0.5}), ["fp16.min_loss_scale"]),
    ds("min-loss-scale-0", tb(fp16={"enabled": True, "min_loss_scale": 0}), ["fp16.min_loss_scale"]),
    ds("loss-scale-window-0", tb(fp16={"enabled": True, "loss_scale_window": 0}), ["fp16.loss_scale_window"]),
    ds("loss-scale-negative", tb(fp16={"enabled": True, "loss_scale": -1}), ["fp16.loss_scale"]),
    ds("loss-scale-infinity", '{"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale": Infinity}}',
       ["fp16.loss_scale"]),
    ds("reduce-bucket-0", tb(zero_optimization={"stage": 2, "reduce_bucket_size": 0}), ["reduce_bucket_size"]),
    ds("reduce-bucket-1.5", tb(zero_optimization={"stage": 2, "reduce_bucket_size": 1.5}), ["reduce_bucket_size"]),
    ds("allgather-bucket-negative", tb(zero_optimization={"stage": 2, "allgather_bucket_size": -1}),
       ["allgather_bucket_size"]),
    ds("prescale-with-reduce-scatter", tb(prescale_gradients=True, zero_optimization={"stage": 2}),
       ["prescale_gradients", "reduce_scatter"]),
    ds("deep", DEEP, ["nested too deeply"]),
    ds("deep-in-value", '{"train_batch_size": 8, "x": ' + DEEP + "}", ["nested too deeply"]),
    ds("top-list", "[]", ["JSON object"]),
    # --- pretrain --load: metadata.json as a schema, shards as torch files -----------------------
    load("files-list", ['"files" is a JSON array']),
    load("files-null", ['"files" is a JSON null']),
    load("files-string", ['"files" is a JSON string']),
    load("files-number", ['"files" is a JSON number']),
    load("entry-list", [SHARD, "JSON array"]),
    load("entry-no-bytes", [SHARD, "no byte count"]),
    load("entry-bytes-string", [SHARD, "no byte count"]),
    load("entry-bytes-negative", [SHARD, "no byte count"]),
    load("entry-no-sha256", [SHARD, "no sha256"]),
    load("entry-sha256-short", [SHARD, "no sha256"]),
    load("path-up", ["'../x.pt'"]),
    load("path-absolute", ["'/etc/x.pt'"]),
    load("tp-string", ["tensor_model_parallel_size"]),
    load("pp-zero", ["pipeline_model_parallel_size"]),
    load("dp-bool", ["data_parallel_size"]),
    load("distopt-string", ["use_distributed_optimizer"]),
    load("metadata-list", ["JSON list"]),
    load("shard-garbage", [SHARD, "not a torch checkpoint file"]),
    load("shard-empty", [SHARD, "empty"]),
    load("shard-zip-no-pickle", [SHARD, "not a torch checkpoint file"]),
    load("shard-pickle-refused", [SHARD, "weights_only", "argparse.Namespace"], torch=True),
    # --- ckpt inspect with a target layout, ckpt convert: refused before any rank or torch ------
    ckpt("inspect missing dir", ["inspect", "{d}/no-such", "--tp", "2"], ["no-such", "not a directory"]),
    ckpt("convert missing dir", ["convert", "{d}/no-such", "{d}/out", "--ckpt-format", "torch"],
         ["no-such", "no checkpoint"]),
    ckpt("convert wrong format", ["convert", "{d}/ckd", "{d}/out", "--ckpt-format", "zarr"],
         ["--ckpt-format zarr", "torch_dist"]),
    ckpt("convert to its own format", ["convert", "{d}/ckd", "{d}/out", "--ckpt-format", "torch_dist"],
         ["torch_dist checkpoint already"]),
    ckpt("convert DST exists", ["convert", "{d}/ckd", "{d}/ckd", "--ckpt-format", "torch"], ["ckd exists"]),
    ckpt("inspect pp does not divide the layers", ["inspect", "{d}/ckd", "--tp", "1", "--pp", "2"],
         ["--num-layers 3", "--pipeline-model-parallel-size 2"]),
    ckpt("inspect tp does not divide the heads", ["inspect", "{d}/ckd", "--tp", "4"],
         ["--num-attention-heads 2", "--tensor-model-parallel-size 4"]),
    ckpt("inspect given a DST", ["inspect", "{d}/ckd", "{d}/out"], ["ckpt convert SRC DST"]),
    ckpt("inspect a legacy checkpoint with a target", ["inspect", "{d}/ckd-legacy", "--tp", "2"],
         ["--ckpt-format torch checkpoint"]),
]

# Values DeepSpeed 0.19.8 accepts, and what it resolves them to (its reader is hjson: a whole
# float below 1e10 is an int; its pydantic sections drop "auto" and convert "4" or "yes"; it
# lower-cases an optimizer's name; clipping defaults to 1.0).
ACCEPTED = [
    ('{"train_batch_size": 8.0}', "train_batch_size", 8),
    ('{"train_micro_batch_size_per_gpu": 2.0, "gradient_accumulation_steps": 4.0}', "train_batch_size", 8),
    ('{"train_batch_size": 8, "zero_optimization": {"stage": 1.0}}', "zero_optimization.stage", 1),
    ('{"train_batch_size": 8, "zero_optimization": {"stage": "1"}}', "zero_optimization.stage", 1),
    ('{"train_batch_size": 8, "fp16": {"enabled": true, "initial_scale_power": -1}}', "initial_dynamic_scale", 0.5),
    ('{"train_batch_size": 8, "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}}',
     "zero_optimization.reduce_bucket_size", 500_000_000),
    ('{"train_batch_size": 8, "zero_optimization": {"stage": 2, "reduce_bucket_size": 2e10}}',
     "zero_optimization.reduce_bucket_size", 20_000_000_000),
    ('{"train_batch_size": 8, "zero_optimization": {"stage": 2, "allgather_bucket_size": 5e8}}',
     "zero_optimization.allgather_bucket_size", 500_000_000),
    ('{"train_batch_size": 8, "zero_optimization": {"stage": 3, "overlap_comm": false}}',
     "zero_optimization.overlap_comm", False),
    ('{"train_batch_size": 8, "zero_optimization": {"stage": 3}}', "zero_optimization.overlap_comm", True),
    ('{"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_comm": true}}',
     "zero_optimization.overlap_comm", True),
    ('{"train_batch_size": 8, "zero_optimization": {"stage": 2, "allgather_bucket_size": 5e7}}',
     "zero_optimization.allgather_bucket_size", 50_000_000),
    ('{"train_batch_size": 8, "zero_optimization": {"stage": 0, "overlap_comm": true}}',
     "zero_optimization.overlap_comm", True),
    ('{"train_batch_size": 8, "zero_optimization": {"stage": "auto", "reduce_bucket_size": "auto"}}',
     "zero_optimization.reduce_bucket_size", 500_000_000),
    ('{"train_batch_size": 8, "fp16": {"enabled": "yes", "hysteresis": "4"}}', "dynamic_loss_scale_args.delayed_shift",
     4),
    ('{"train_batch_size": 8, "optimizer": {"type": "adam"}}', "optimizer.type", "Adam"),
    ('{"train_batch_size": 8, "optimizer": {"type": "ADAMW"}}', "optimizer.type", "AdamW"),
    ('{"train_batch_size": 8}', "gradient_clipping", 1.0),
    ('{"train_batch_size": 8, "gradient_clipping": -1}', "gradient_clipping", -1.0),
    ('{"train_batch_size": 8, "fp16": {"enabled": true, "min_loss_scale": 1.0, "initial_scale_power": 16.0}}',
     "dynamic_loss_scale_args.min_scale", 1),
]


# Rows run forked, one child each, as a user's fresh process would be; the rest one after
# another in one torch-free harness (refusals.py: ~5 ms of CPU a row instead of ~20).
FORKED = ("world_info []", "preprocess line-1-not-json-workers", "load shard-garbage", "ds_config clip-nan")


def _children() -> set[int]:
    found = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            found |= {int(pid) for pid in f.read().split()}
    return found


def _here(case: Case) -> Outcome:
    """A row run through the entry point in this process (tests/cli_here.py), as an Outcome: a
    process of this one that it leaves running counts as left."""
    before = _children()
    done = minitron_here(*case.argv, cwd=case.cwd, env={**os.environ, "COLUMNS": "200"})
    return Outcome(case=case, code=done.returncode, stdout=done.stdout, stderr=done.stderr, seconds=0.0,
                   torch_imported=True, timed_out=False, left_processes=bool(_children() - before))


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad-files")
    write_files(d, ROWS, ACCEPTED)
    write_checkpoints(d, [row[0][len("load "):] for row in ROWS if row[0].startswith("load ")], SHARD)
    def case(row):
        return Case([a.replace("{d}", str(d)) for a in row[1]], cwd=str(d), id=row[0])

    cases = [case(row) for row in ROWS if not (len(row) > 4 and row[4])]
    cases += [Case(["ds-config", str(d / f"accepted-{n}.json"), "--json"], cwd=str(d), id=f"accepted {n}")
              for n in range(len(ACCEPTED))]
    # The rows whose refusal needs torch (a shard loaded weights-only) run in this process,
    # which has it already: a harness of their own would import it again (~1.5 s of CPU).
    found = [_here(case(row)) for row in ROWS if len(row) > 4 and row[4]]
    found += run_cases([c for c in cases if c.id in FORKED])
    found += run_cases([c for c in cases if c.id not in FORKED], fork=False)
    return {outcome.case.id: outcome for outcome in found}, d


def test_enough_rows():
    assert len(ROWS) >= 130 and len({row[0] for row in ROWS}) == len(ROWS)
    assert set(FORKED) <= {row[0] for row in ROWS}


@pytest.mark.parametrize("row", ROWS, ids=[row[0] for row in ROWS])
def test_refused_in_one_line(row, outcomes):
    found, d = outcomes
    outcome = found[row[0]]
    torch_allowed = len(row) > 4 and row[4]
    problems = outcome.refusal_problems(must_contain=tuple(row[2]), torch_allowed=torch_allowed)
    assert not problems, f"{problems}\n{outcome.describe()}"
    assert not (d / "logs").exists() and not list(d.glob("*_document.bin")), "something started or was written"


@pytest.mark.parametrize("row", [row for row in ROWS if row[0].startswith("preprocess")], ids=lambda row: row[0])
def test_preprocess_says_nothing_before_its_error(row, outcomes):
    """No progress bar (nor the empty line rich leaves where stderr is no terminal) first."""
    outcome = outcomes[0][row[0]]
    assert outcome.stderr.startswith("minitron: error: "), outcome.describe()


@pytest.mark.parametrize("number", range(len(ACCEPTED)), ids=[a[0] for a in ACCEPTED])
def test_deepspeed_accepts_and_resolves_to_its_value(number, outcomes):
    outcome = outcomes[0][f"accepted {number}"]
    assert outcome.code == 0, outcome.describe()
    resolved = json.loads(outcome.stdout)
    _, key, expected = ACCEPTED[number]
    for part in key.split("."):
        resolved = resolved[part]
    assert resolved == expected and type(resolved) is type(expected), (resolved, expected)
