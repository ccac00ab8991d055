"""Every bad input is one line, exit 2, before any process starts (issue #11).

One table: each case is a command line for ``minitron`` (a few through the real executable,
the rest through its entry point in this process: see REAL), an optional setup that damages
something first, and words the one line must contain. Every case also
checks that no rank started: the run's log and trace folders never appear.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

from cli_here import run_minitron

TINY = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
        "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-3",
        "--mock-data", "--vocab-size", "64", "--pipeline-model-parallel-size", "2"]
SHARD = "iter_0000002/mp_rank_00_001/model_optim_rng.pt"


def run(*args, cwd=None, here=False):
    """The real executable, or (``here``) its entry point in this process, at 200 columns so
    that a long one-line refusal is never wrapped into two."""
    return run_minitron(*args, cwd=cwd, env={**os.environ, "COLUMNS": "200"}, timeout=300, here=here)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A real 2-rank checkpoint (pp 2: two shards), saved once for every --load case."""
    tmp = tmp_path_factory.mktemp("saved")
    # Here: the ranks fork from this process, which has torch already (a fresh interpreter
    # would import it again first).
    done = run("pretrain", "--world", "2", "--log-dir", tmp / "logs", *TINY, "--save", tmp / "ck",
               "--ckpt-format", "torch", here=True)   # the legacy format's files are what these cases damage
    assert done.returncode == 0, done.stderr
    return tmp / "ck"


# --- ways to damage a copy of the checkpoint ----------------------------------------------
def flip_byte(ck: Path) -> None:
    shard = ck / SHARD
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in the middle of the tensor data
    shard.write_bytes(bytes(data))


def truncate(rel: str, keep: float):
    def damage(ck: Path) -> None:
        path = ck / rel
        path.write_bytes(path.read_bytes()[:int(path.stat().st_size * keep)])
    return damage


def garbage_shard(ck: Path) -> None:
    shard = ck / SHARD
    shard.write_bytes(os.urandom(shard.stat().st_size))


def undecodable_metadata(ck: Path) -> None:
    path = ck / "iter_0000002/metadata.json"
    path.write_bytes(b"\xff\xfe" + path.read_bytes())


def marker_is_a_folder(ck: Path) -> None:
    marker = ck / "latest_checkpointed_iteration.txt"
    marker.unlink()
    marker.mkdir()


def resume(*extra):
    return ["pretrain", "--world", "2", "--log-dir", "{tmp}/logs", "--trace", "{tmp}/trace", *TINY,
            "--load", "{ck}", *extra]


# --- other setups ---------------------------------------------------------------------------
def busy_port(tmp: Path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


SCRIPT = "{tmp}/script.py"
TRACE = ["trace", "--world", "2", "--backend", "gloo", "--log-dir", "{tmp}/logs"]
# (id, argv with {tmp} {file} {ck} {port} placeholders, setup on the checkpoint copy, words)
CASES = [
    # output places (#11.2, #11.3): a file where a folder goes, or nowhere writable
    ("trace-out-file", TRACE + ["--out", "{file}"], None, ["--out", "existing file"]),
    ("trace-out-unwritable", TRACE + ["--out", "/proc/minitron/x"], None, ["--out", "cannot write"]),
    ("trace-log-dir-file", ["trace", "--world", "2", "--backend", "gloo", "--out", "{tmp}/trace",
                            "--log-dir", "{file}"], None, ["--log-dir"]),
    ("launch-trace-file", ["launch", "--world", "2", "--log-dir", "{tmp}/logs", "--trace", "{file}", SCRIPT],
     None, ["--trace"]),
    ("launch-log-dir-under-file", ["launch", "--world", "2", "--log-dir", "{file}/logs", SCRIPT], None,
     ["--log-dir", "is a file"]),
    ("pretrain-save-under-file", ["pretrain", "--world", "2", "--log-dir", "{tmp}/logs", *TINY,
                                  "--save", "{file}/ck"], None, ["--save"]),
    ("pretrain-save-unwritable", ["pretrain", "--world", "2", "--log-dir", "{tmp}/logs", *TINY,
                                  "--save", "/proc/minitron-ck"], None, ["--save", "cannot write"]),
    ("vscode-path-folder", ["vscode", "--world", "2", "--path", "{tmp}"], None, ["--path", "directory"]),
    ("vscode-path-under-file", ["vscode", "--world", "2", "--path", "{file}/launch.json"], None, ["--path"]),
    ("vscode-undecodable", ["vscode", "--world", "2", "--path", "{tmp}/bad.json"], None, ["bad.json", "UTF-8"]),
    # the port and the program (#11.2)
    ("port-out-of-range", ["launch", "--world", "2", "--log-dir", "{tmp}/logs", "--master-port", "70000", SCRIPT],
     None, ["--master-port 70000", "1..65535"]),
    ("port-in-use", ["launch", "--world", "2", "--log-dir", "{tmp}/logs", "--master-port", "{port}", SCRIPT],
     None, ["in use"]),
    ("no-such-module", ["launch", "--world", "2", "--log-dir", "{tmp}/logs", "-m", "no_such_module"], None,
     ["no_such_module"]),
    # sizes the machine cannot hold (#11.4)
    ("groups-huge", ["groups", "--world", str(10**23)], None, ["at most 131072"]),
    ("gloo-too-many", ["trace", "--world", "10000", "--backend", "gloo", "--out", "{tmp}/trace"], None,
     ["at most", "per core"]),
    ("fake-too-many", ["trace", "--world", "5000", "--backend", "fake", "--out", "{tmp}/trace"], None,
     ["at most 2048"]),
    ("preprocess-workers", ["preprocess", "--input", "{tmp}/in.jsonl", "--output-prefix", "{tmp}/out",
                            "--workers", "100000"], None, ["--workers 100000", "per core"]),
    ("preprocess-bad-line", ["preprocess", "--input", "{tmp}/bad.jsonl", "--output-prefix", "{tmp}/out"],
     None, ["bad.jsonl:2"]),
    ("preprocess-undecodable-vocab", ["preprocess", "--input", "{tmp}/in.jsonl", "--output-prefix", "{tmp}/out",
                                      "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "{tmp}/bad.json",
                                      "--merge-file", "{tmp}/in.jsonl"], None, ["--vocab-file", "bad.json", "UTF-8"]),
    ("launch-pretrain-save-unwritable", ["launch", "--world", "2", "--log-dir", "{tmp}/logs", "-m",
                                         "minitron.pretrain_gpt", *TINY, "--save", "/proc/minitron-ck"], None,
     ["--save", "cannot write"]),
    # --load (#11.2, #11.5, #11.6, #11.10)
    ("load-regular-file", ["pretrain", "--world", "2", "--log-dir", "{tmp}/logs", *TINY, "--load", "{file}"],
     None, ["--load", "is a file"]),
    ("load-marker-folder", resume(), marker_is_a_folder, ["latest_checkpointed_iteration.txt", "directory"]),
    ("load-flipped-byte", resume(), flip_byte, [SHARD, "sha256"]),
    ("load-truncated-shard", resume(), truncate(SHARD, 0.5), [SHARD, "cut short"]),
    ("load-empty-shard", resume(), truncate(SHARD, 0), [SHARD, "0 bytes"]),
    ("load-garbage-shard", resume(), garbage_shard, [SHARD, "sha256"]),
    ("load-truncated-metadata", resume(), truncate("iter_0000002/metadata.json", 0.5),
     ["metadata.json", "not valid JSON"]),
    ("load-undecodable-metadata", resume(), undecodable_metadata, ["metadata.json", "UTF-8"]),
    ("load-other-seq-length", resume("--seq-length", "32"), None,
     ["--seq-length 16 in the checkpoint, 32 here", "--max-position-embeddings 16"]),
    ("load-other-precision", resume("--bf16"), None, ["(--fp16/--bf16): float32 in the checkpoint, bfloat16 here"]),
]


# Rows run by the real executable (one per kind of check); the others call its entry point in
# this process: the same code, without a fresh interpreter (~0.5 s) each.
REAL = {"trace-out-file", "preprocess-workers", "load-flipped-byte"}


@pytest.mark.parametrize("name, argv, damage, words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_nothing_starts(name, argv, damage, words, tmp_path, request):
    afile = tmp_path / "a-file"
    afile.write_text("not a folder\n")
    (tmp_path / "script.py").write_text("open('STARTED', 'w')\n")
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    (tmp_path / "bad.jsonl").write_text('{"text": "hello"}\n{"text": \n')
    (tmp_path / "bad.json").write_bytes(b'{"configurations": ["\xff"]}')
    ck, port, sock = tmp_path / "ck", None, None
    if any("{ck}" in a for a in argv):
        shutil.copytree(request.getfixturevalue("saved"), ck)
        if damage:
            damage(ck)
    if any("{port}" in a for a in argv):
        sock, port = busy_port(tmp_path)
    try:
        args = [a.format(tmp=tmp_path, file=afile, ck=ck, port=port) for a in argv]
        done = run(*args, cwd=tmp_path, here=name not in REAL)
    finally:
        if sock:
            sock.close()
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("minitron: error:"), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert all(w in lines[0] for w in words), lines[0]
    # No rank started: no log, no trace, the script never ran, no output written.
    for started in ("logs", "trace", "STARTED", "out_text_document.bin"):
        assert not (tmp_path / started).exists(), started
    if ck.exists():  # the damaged checkpoint is refused, not repaired or half-overwritten
        assert sorted(p.name for p in ck.iterdir()) == ["iter_0000002", "latest_checkpointed_iteration.txt"]


def test_the_untouched_checkpoint_passes_the_checks(saved, tmp_path):
    """The control: the same resume from an undamaged copy gets past every check (it fails
    later only because --train-iters 2 is already done, or not at all)."""
    from minitron.training.checkpoint_files import read_metadata
    from minitron.training.checkpoint_resume import check_resumable

    meta = read_metadata(saved, 2)
    assert sorted(meta["files"]) == ["mp_rank_00_000/model_optim_rng.pt", "mp_rank_00_001/model_optim_rng.pt"]

    class Args:  # what validate_args would hand over for the same run
        load, use_distributed_optimizer, data_parallel_size = saved, False, 1
    for key, value in meta.items():
        setattr(Args, key, value)
    check_resumable(Args)  # raises on any mismatch
    flipped = tmp_path / "ck"
    shutil.copytree(saved, flipped)
    flip_byte(flipped)
    Args.load = flipped
    with pytest.raises(ValueError, match="sha256"):
        check_resumable(Args)
    json.dumps(meta)  # metadata stays plain JSON
