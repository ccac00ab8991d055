"""The files tests/test_bad_inputs_files.py's rows read: written once into one folder, so
the table itself stays a table of command lines."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import zipfile
from pathlib import Path


def write_files(d: Path, rows: list, accepted: list) -> None:
    """Every file the rows read: a row's fourth item maps names under ``d`` to their text;
    ``accepted``'s configs are written as accepted-N.json."""
    (d / "ok.jsonl").write_text('{"text": "hello"}\n')
    for name in ("one-line.jsonl", "hosts-huge-file"):
        with open(d / name, "wb") as f:
            f.truncate(80 << 20)  # 80 MiB without a newline: sparse, so free to make
    for row in rows:
        for rel, text in (row[3] if len(row) > 3 else {}).items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(text.encode("utf-8", "surrogateescape"))
    for number, (text, _, _) in enumerate(accepted):
        (d / f"accepted-{number}.json").write_text(text)


def write_checkpoints(d: Path, names: list, shard: str) -> None:
    """ck-NAME for each name: a one-shard checkpoint (iteration 2, tp = pp = dp = 1), damaged
    the way its name says; an unknown name gets a sound one."""
    import torch  # the shards are torch files; the test process has torch anyway (conftest)

    def save(obj) -> bytes:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        return buffer.getvalue()

    good = save({"iteration": 2, "model": {"w": torch.zeros(2)}})
    no_pickle = io.BytesIO()
    with zipfile.ZipFile(no_pickle, "w") as archive:
        archive.writestr("archive/readme.txt", "not a checkpoint")
    shards = {"shard-garbage": os.urandom(500), "shard-empty": b"", "shard-zip-no-pickle": no_pickle.getvalue(),
              "shard-pickle-refused": save({"args": argparse.Namespace(lr=1.0)})}

    def entry(data: bytes) -> dict:
        return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    metas = {"files-list": {"files": [shard]}, "files-null": {"files": None}, "files-string": {"files": shard},
             "files-number": {"files": 3}, "entry-list": {"files": {shard: [1, 2]}},
             "entry-no-bytes": {"files": {shard: {"sha256": entry(good)["sha256"]}}},
             "entry-bytes-string": {"files": {shard: {**entry(good), "bytes": "12"}}},
             "entry-bytes-negative": {"files": {shard: {**entry(good), "bytes": -1}}},
             "entry-no-sha256": {"files": {shard: {"bytes": len(good)}}},
             "entry-sha256-short": {"files": {shard: {**entry(good), "sha256": "ab"}}},
             "path-up": {"files": {"../x.pt": entry(good)}}, "path-absolute": {"files": {"/etc/x.pt": entry(good)}},
             "tp-string": {"tensor_model_parallel_size": "1"}, "pp-zero": {"pipeline_model_parallel_size": 0},
             "dp-bool": {"data_parallel_size": True}, "distopt-string": {"use_distributed_optimizer": "yes"},
             "metadata-list": []}
    for name in names:
        data = shards.get(name, good)
        meta = metas.get(name, {"files": {shard: entry(data)}})
        if isinstance(meta, dict):
            meta = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "data_parallel_size": 1,
                    "files": {shard: entry(data)}, **meta}
        ck = d / f"ck-{name}"
        (ck / "iter_0000002" / "mp_rank_00").mkdir(parents=True)
        (ck / "latest_checkpointed_iteration.txt").write_text("2")
        (ck / "iter_0000002" / "metadata.json").write_text(json.dumps(meta))
        (ck / "iter_0000002" / shard).write_bytes(data)
