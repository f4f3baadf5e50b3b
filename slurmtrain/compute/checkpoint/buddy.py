"""Moving a node's checkpoint files to another node through the process group (node-local tier).

Node-local directories need not be visible from any other node, so the copy travels over the
ranks' own process group: one node's lead rank sends, another's receives and writes. Files are
written under a `.tmp` name, fsynced, then renamed: a half-received copy is never a candidate.
The bytes go as uint8 tensors in CHUNK pieces, after a small header (names and sizes): pickling a
node's shards through send_object_list ran at 96 MB/s on loopback gloo (bench/local_tier_rates.py)
and would stage every byte on the GPU at once under NCCL; a chunk bounds that to CHUNK.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

from slurmtrain.common import durable

if TYPE_CHECKING:
    import torch

Files = dict[str, Union[bytes, memoryview]]  # relative name -> content
CHUNK = 64 * 2**20  # bytes a send moves at once (and the most staged on a GPU under NCCL)


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


def _write(path: Path, data: Union[bytes, memoryview]) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def send(files: Files, dst: int) -> None:
    """`files` to rank `dst`: a header of names and sizes, then their bytes in CHUNK pieces."""
    import torch
    import torch.distributed as dist

    names = list(files)
    sizes = [len(files[n]) for n in names]
    dist.send_object_list([(names, sizes)], dst=dst)
    payload = bytearray(sum(sizes))
    at = 0
    for n, size in zip(names, sizes):
        payload[at : at + size] = files[n]
        at += size
    flat, device = torch.frombuffer(payload, dtype=torch.uint8), _device()
    for start in range(0, len(payload), CHUNK):
        dist.send(flat[start : start + CHUNK].to(device), dst=dst)


def recv(src: int) -> Files:
    """What `send` sent from rank `src`: views into one received buffer, by name."""
    import torch
    import torch.distributed as dist

    box: list[object] = [None]
    dist.recv_object_list(box, src=src)
    header = box[0]
    assert isinstance(header, tuple)
    names: list[str] = header[0]
    sizes: list[int] = header[1]
    flat, device = torch.empty(sum(sizes), dtype=torch.uint8), _device()
    for start in range(0, flat.numel(), CHUNK):
        part = flat[start : start + CHUNK]
        if device.type == "cpu":
            dist.recv(part, src=src)
        else:
            staged = torch.empty_like(part, device=device)
            dist.recv(staged, src=src)
            part.copy_(staged)
    view, at = memoryview(flat.numpy()), 0
    files: Files = {}
    for n, size in zip(names, sizes):
        files[n] = view[at : at + size]
        at += size
    return files


def _device() -> torch.device:
    """Where tensors must be for the process group's backend: the GPU under NCCL."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def ring(node: int, nodes: int, leads: list[int], payload: Files) -> Files:
    """Node leads only: send `payload` to the next node's lead, return the previous node's.
    Even nodes send first, odd ones receive first: blocking sends never wait in a cycle."""
    nxt, prev = leads[(node + 1) % nodes], leads[(node - 1) % nodes]
    if node % 2 == 0:
        send(payload, nxt)
        return recv(prev)
    got = recv(prev)
    send(payload, nxt)
    return got
