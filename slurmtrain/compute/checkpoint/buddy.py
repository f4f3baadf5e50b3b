"""Moving a node's checkpoint files to another node through the process group (node-local tier).

Node-local directories need not be visible from any other node, so the copy travels over the
ranks' own process group: one node's lead rank sends, another's receives and writes. Files are
written under a `.tmp` name, fsynced, then renamed: a half-received copy is never a candidate.
The bytes go as uint8 tensors over the files' own buffers, in pieces of at most CHUNK, after a
small header (names and sizes): pickling a node's shards through send_object_list ran at 96 MB/s
on loopback gloo (bench/local_tier_rates.py) and would stage every byte on the GPU at once under
NCCL; a piece bounds that to CHUNK. In the ring each link's two directions move at once.
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional, Union

from slurmtrain.common import durable

if TYPE_CHECKING:
    import torch

Files = dict[str, Union[bytes, bytearray, memoryview]]  # relative name -> content
CHUNK = 64 * 2**20  # bytes a send moves at once (and the most staged on a GPU under NCCL)


def read_tree(directory: Path, names: Optional[list[str]] = None) -> Files:
    """`names` (all files when None) of `directory`, relative names to their bytes (writable
    buffers: a piece's tensor is made over them without a copy)."""
    if names is None:
        names = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())
    return {name: _read(directory / name) for name in names}


def _read(path: Path) -> bytearray:
    with open(path, "rb") as f:
        data, got = bytearray(os.fstat(f.fileno()).st_size), 0
        with memoryview(data) as view:
            while got < len(data) and (n := f.readinto(view[got:])):
                got += n
    del data[got:]  # a file that shrank while read (never one of ours: sealed, renamed)
    return data


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


def _write(path: Path, data: Union[bytes, bytearray, memoryview]) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def send(files: Files, dst: int) -> None:
    """`files` to rank `dst`: a header of names and sizes, then their bytes in pieces."""
    import torch.distributed as dist

    header = _header(files)
    dist.send_object_list([header], dst=dst)
    device = _device()
    for piece in _outgoing(files, header):
        dist.send(piece.to(device), dst=dst)


def recv(src: int) -> Files:
    """What `send` sent from rank `src`: views into one received buffer, by name."""
    header = _recv_header(src)
    flat, parts = _incoming(header)
    device = _device()
    for part in parts:
        staged = _staging(part, device)
        _wait([("recv", staged, src)])
        _land(part, staged)
    return _unpack(header, flat)


def ring(node: int, nodes: int, leads: list[int], payload: Files) -> Files:
    """Node leads only: send `payload` to the next node's lead, return the previous node's. The
    headers go even nodes first (blocking object sends never wait in a cycle); then each piece
    out and the previous node's piece in move at once, both directions of every link busy."""
    import torch.distributed as dist

    nxt, prev = leads[(node + 1) % nodes], leads[(node - 1) % nodes]
    mine = _header(payload)
    if node % 2 == 0:
        dist.send_object_list([mine], dst=nxt)
        theirs = _recv_header(prev)
    else:
        theirs = _recv_header(prev)
        dist.send_object_list([mine], dst=nxt)
    flat, parts = _incoming(theirs)
    out, device = _outgoing(payload, mine), _device()
    for i in range(max(len(_pieces(mine[1])), len(parts))):
        ops: list[tuple[str, torch.Tensor, int]] = []
        piece = next(out, None)
        if piece is not None:
            ops.append(("send", piece.to(device), nxt))
        staged = _staging(parts[i], device) if i < len(parts) else None
        if staged is not None:
            ops.append(("recv", staged, prev))
        _wait(ops)
        if staged is not None:
            _land(parts[i], staged)
    return _unpack(theirs, flat)


Header = tuple[list[str], list[int]]  # names, sizes in bytes


def _header(files: Files) -> Header:
    names = list(files)
    return names, [len(files[n]) for n in names]


def _recv_header(src: int) -> Header:
    import torch.distributed as dist

    box: list[object] = [None]
    dist.recv_object_list(box, src=src)
    header = box[0]
    assert isinstance(header, tuple) and len(header) == 2
    return list(header[0]), [int(n) for n in header[1]]


def _pieces(sizes: list[int]) -> list[tuple[int, int, int]]:
    """(file index, start, end) of each send: none over CHUNK or across two files; an empty
    file has none (a tensor over no bytes cannot be made from a buffer)."""
    return [(i, a, min(a + CHUNK, n)) for i, n in enumerate(sizes) for a in range(0, n, CHUNK)]


def _outgoing(files: Files, header: Header) -> Iterator[torch.Tensor]:
    """Each piece as a uint8 tensor over the file's own buffer (no copy of the node's bytes)."""
    import torch

    names, sizes = header
    for i, a, b in _pieces(sizes):
        data = files[names[i]]
        buffer = bytearray(data[a:b]) if isinstance(data, bytes) else memoryview(data)[a:b]
        yield torch.frombuffer(buffer, dtype=torch.uint8)


def _incoming(header: Header) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One buffer for everything the header names, and its slices each piece lands in."""
    import torch

    sizes = header[1]
    flat = torch.empty(sum(sizes), dtype=torch.uint8)
    at = [0, *itertools.accumulate(sizes)]
    return flat, [flat[at[i] + a : at[i] + b] for i, a, b in _pieces(sizes)]


def _unpack(header: Header, flat: torch.Tensor) -> Files:
    view, at = memoryview(flat.numpy()), 0
    files: Files = {}
    for name, size in zip(*header):
        files[name] = view[at : at + size]
        at += size
    return files


def _staging(part: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Where a piece is received: in place on CPU; under NCCL a GPU buffer of one piece."""
    import torch

    return part if device.type == "cpu" else torch.empty_like(part, device=device)


def _land(part: torch.Tensor, staged: torch.Tensor) -> None:
    if staged is not part:
        part.copy_(staged)


def _wait(ops: list[tuple[str, torch.Tensor, int]]) -> None:
    """The sends and receives posted together, then waited for."""
    import torch.distributed as dist

    posted = [
        dist.P2POp(dist.isend if op == "send" else dist.irecv, t, peer) for op, t, peer in ops
    ]
    for request in dist.batch_isend_irecv(posted) if posted else []:
        request.wait()


def _device() -> torch.device:
    """Where tensors must be for the process group's backend: the GPU under NCCL."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
