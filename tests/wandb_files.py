"""Read back what the real wandb library wrote in offline mode (the run's ``.wandb`` record log).

The file is W&B's LevelDB-style log: a 7-byte header (``:W&B``, magic 0xBEE1, version), then
32 KiB blocks of chunks (crc32c:4, length:2, type:1 = full/first/middle/last) carrying
serialized ``wandb_internal_pb2.Record`` messages. wandb >= 0.2x no longer ships a Python reader.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str | Path):
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", "not a W&B record log"
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            buf = chunk
        elif kind == FIRST:
            buf = chunk
            continue
        elif kind == MIDDLE:
            buf += chunk
            continue
        elif kind == LAST:
            buf += chunk
        rec = pb.Record()
        rec.ParseFromString(buf)
        yield rec


def read_run(run_dir: str | Path) -> dict:
    """history rows, summary, config, run id, group, name, tags and job type of the offline run(s) under ``run_dir``."""
    files = sorted(Path(run_dir).glob("wandb/*run-*/run-*.wandb"))
    assert files, f"no wandb run file under {run_dir}"
    out = {
        "history": [],
        "summary": {},
        "config": {},
        "ids": set(),
        "group": None,
        "name": None,
        "tags": [],
        "job_type": None,
        "files": files,
    }
    for f in files:
        for r in records(f):
            kind = r.WhichOneof("record_type")
            if kind == "history":
                out["history"].append(
                    {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
                )
            elif kind == "summary":
                out["summary"].update(
                    {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.summary.update}
                )
            elif kind == "config":
                out["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
            elif kind == "run":
                out["ids"].add(r.run.run_id)
                out["config"].update({i.key: json.loads(i.value_json) for i in r.run.config.update})
                out["group"] = r.run.run_group or out["group"]
                out["name"], out["tags"], out["job_type"] = r.run.display_name, list(r.run.tags), r.run.job_type
    return out
