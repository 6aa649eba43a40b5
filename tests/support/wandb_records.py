"""The records of a W&B offline run (``run-<id>.wandb``), read back in-process.

The file is wandb's transaction log: a 7-byte header (``:W&B``, a 2-byte magic, a version byte), then
LevelDB's log format (32 KiB blocks; each chunk a 7-byte header: masked CRC32C, length, type FULL/FIRST/
MIDDLE/LAST; a block's tail shorter than a header is padding). Each record is a serialized
``wandb_internal_pb2.Record``, the protobuf wandb itself writes. ``wandb leet inspect`` prints the same
records as text, but starts wandb-core for it (seconds); this reads them directly. The CRC is not checked:
the tests read a file that was written a moment before, and protobuf refuses a torn record anyway.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[pb.Record]:
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log (starts {data[:4]!r})")
    out: list[pb.Record] = []
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:
            pos += left_in_block  # padding at a block's end
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:
            pos += left_in_block  # the rest of the block is zeros
            continue
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (FULL, LAST):
            rec = pb.Record()
            rec.ParseFromString(pending)
            out.append(rec)
    return out


def run_file(wandb_dir: Path) -> Path:
    """The one offline run's transaction log under ``wandb_dir`` (RUN_ROOT/wandb)."""
    [path] = wandb_dir.glob("offline-run-*/run-*.wandb")
    return path


def history(path: Path) -> list[dict[str, Any]]:
    """Every ``run.log`` row: {key: value} (a histogram's parts under ``<tag>/values``, ``<tag>/bins``...)."""
    rows = []
    for rec in records(path):
        if rec.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return rows


def run_record(path: Path) -> pb.RunRecord:
    [run] = [r.run for r in records(path) if r.WhichOneof("record_type") == "run"]
    return run
