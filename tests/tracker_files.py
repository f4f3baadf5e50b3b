"""Read what the trackers wrote, as their own stores hold it: W&B's offline .wandb files (records
in LevelDB's log format, each a wandb_internal_pb2.Record) and MLflow's file store (through
MlflowClient). wandb 0.31 moved its reader into the Go core, so the format's framing is read here:
32 KiB blocks, 7-byte headers (CRC-32, length, FULL/FIRST/MIDDLE/LAST) after a 7-byte file header."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B data file"
    pos, pieces = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pieces = chunk
        elif kind == MIDDLE:
            pieces += chunk
        elif kind == LAST:
            yield pieces + chunk


def wandb_offline(run: Path) -> list[dict[str, Any]]:
    """Each offline-run-* folder of a run dir: {path, run_id, start, steps, rows} (rows: history
    dicts with `_step`), in the order the attempts started."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for path in sorted((run / "wandb").glob("offline-run-*/run-*.wandb")):
        info: dict[str, Any] = {"path": path, "run_id": None, "start": 0.0, "rows": []}
        for blob in _records(path):
            rec = pb.Record()
            rec.ParseFromString(blob)
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                info["run_id"] = rec.run.run_id
                info["start"] = rec.run.start_time.ToSeconds()
            elif kind == "history":
                row = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in rec.history.item
                }
                info["rows"].append(row)
        info["steps"] = [int(r["_step"]) for r in info["rows"]]
        out.append(info)
    return sorted(out, key=lambda i: (i["start"], i["steps"][:1]))


def mlflow_runs(run: Path) -> list[Any]:
    """Every MLflow run in the run dir's file store (all experiments)."""
    import os

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids)


def mlflow_steps(run: Path, run_id: str, key: str = "loss") -> list[int]:
    """The steps of `key`'s history, in the order they were logged."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    return [m.step for m in client.get_metric_history(run_id, key)]
