"""Moving a node's checkpoint files to another node through the process group (node-local tier).

Node-local directories need not be visible from any other node, so the copy travels over the
ranks' own process group: one node's lead rank sends, another's receives and writes. Files are
written under a `.tmp` name, fsynced, then renamed: a half-received copy is never a candidate.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from slurmtrain.common import durable

Files = dict[str, bytes]  # relative name -> content


def read_tree(directory: Path, names: Optional[list[str]] = None) -> Files:
    """`names` (all files when None) of `directory`, relative names to bytes."""
    if names is None:
        names = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())
    return {name: (directory / name).read_bytes() for name in names}


def write_tree(files: Files, final: Path) -> None:
    """`files` into `final` (replaced whole): written to `final.tmp`, fsynced, renamed."""
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for name, data in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, data)
    tmp.mkdir(parents=True, exist_ok=True)
    old = final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    durable.fsync_path(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def add_files(files: Files, directory: Path) -> None:
    """Received shared files into a `.tmp` directory still being written (before its seal)."""
    for name, data in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, data)


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def send(obj: object, dst: int) -> None:
    import torch.distributed as dist

    dist.send_object_list([obj], dst=dst)


def recv(src: int) -> object:
    import torch.distributed as dist

    box: list[object] = [None]
    dist.recv_object_list(box, src=src)
    return box[0]


def ring(node: int, nodes: int, leads: list[int], payload: object) -> object:
    """Node leads only: send `payload` to the next node's lead, return the previous node's.
    Even nodes send first, odd ones receive first: blocking sends never wait in a cycle."""
    nxt, prev = leads[(node + 1) % nodes], leads[(node - 1) % nodes]
    if node % 2 == 0:
        send(payload, nxt)
        return recv(prev)
    got = recv(prev)
    send(payload, nxt)
    return got
