"""A shard file written with O_DIRECT (compute node): the bytes go from the tensors to the disk.

Buffered writes cost the kernel a page-cache page per 4 KiB (allocation, copy, writeback, reclaim),
which under memory pressure is many times slower than O_DIRECT from an aligned buffer. torch.save
hands storages at 64-byte offsets, not the 4 KiB O_DIRECT needs, so each record is copied once into
one of a few reused page-aligned buffers while a thread hashes and two threads write the previous
ones (memmove, CRC-32 and os.pwrite all release the GIL): a save costs about max(copy, hash, disk).
The last partial block is padded, the file truncated.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

from slurmtrain.common.checkpoint_format import Crc32

if TYPE_CHECKING:
    from typing_extensions import Buffer

ALIGN = 4096  # O_DIRECT alignment of memory, offsets and lengths on every filesystem we meet
BUFFER = 16 << 20  # bytes per O_DIRECT write: large enough for network filesystems' stripes
DEPTH = 3  # buffers: one filling, two in flight
WRITERS = 2  # writes in flight at once (positioned): a network filesystem serves one per RPC
Progress = Callable[[int], None]


def _address(view: memoryview) -> int:
    """The address of a (possibly read-only) contiguous buffer, without copying it."""
    return np.frombuffer(view, dtype=np.uint8).ctypes.data if len(view) else 0


class Buffers:
    """Page-aligned buffers kept from one save to the next (a fresh mapping page-faults)."""

    def __init__(self, size: int = 0, depth: int = DEPTH) -> None:
        self.size, self.depth = size or BUFFER, depth
        self.maps: list[mmap.mmap] = []

    def get(self) -> list[tuple[mmap.mmap, int]]:
        while len(self.maps) < self.depth:
            self.maps.append(mmap.mmap(-1, self.size))
        return [(m, _address(memoryview(m))) for m in self.maps]


def open_direct(path: str) -> Optional[int]:
    """A new file opened for O_DIRECT writes, or None where the filesystem refuses it (tmpfs)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o644)
    except OSError as err:
        if err.errno == errno.EINVAL:
            return None
        raise


class DirectFile:
    """What torch.save writes into (the `_RawFile` interface): buffers, hashes, writes aligned.

    `write_seconds`: copying into the buffers; `wait_seconds`: waiting for the disk to free one;
    `hash_seconds`: waiting for a buffer's CRC-32 (what the overlap did not hide). Keeps the
    OSError in `error`. Call `finish` before fsync, `close` always.
    """

    def __init__(
        self,
        fd: int,
        hashing: bool,
        progress: Optional[Progress] = None,
        buffers: Optional[Buffers] = None,
    ) -> None:
        self.fd, self.progress = fd, progress
        self.error: Optional[OSError] = None
        self.checksum = Crc32() if hashing else None
        self.buffers = (buffers or Buffers()).get()
        self.size = len(self.buffers[0][0])
        self.io = ThreadPoolExecutor(min(WRITERS, len(self.buffers) - 1), "checkpoint-direct-io")
        self.inflight: list[Optional[Future[int]]] = [None] * len(self.buffers)
        self.hasher = ThreadPoolExecutor(1, "checkpoint-crc") if hashing else None
        self.hashes: list[Optional[Future[None]]] = [None] * len(self.buffers)
        self.current, self.fill = 0, 0  # the buffer being filled and its bytes
        self.offset = 0  # bytes handed to `write`
        self.submitted = 0  # file offset of the next buffer handed to the writer threads
        self.written = 0  # bytes the disk has taken (what `progress` is told)
        self.hash_seconds = self.write_seconds = self.wait_seconds = 0.0
        self.direct = True  # until a write is refused (EINVAL): then the page cache

    def write(self, data: Buffer) -> int:
        view = memoryview(data).cast("B")
        source, done, total = _address(view), 0, len(view)
        while done < total:
            buffer, address = self.buffers[self.current]
            n = min(self.size - self.fill, total - done)
            started = time.perf_counter()
            ctypes.memmove(address + self.fill, source + done, n)
            self.write_seconds += time.perf_counter() - started
            self.fill += n
            done += n
            if self.fill == self.size:
                self._submit(self.size)
        self.offset += total
        return total

    def _submit(self, length: int) -> None:
        """Hand the current buffer to the writer thread and move to the next free one."""
        buffer, _ = self.buffers[self.current]
        if self.checksum is not None and self.hasher is not None:  # in order, beside the write
            piece = memoryview(buffer)[: self.fill]
            self.hashes[self.current] = self.hasher.submit(self.checksum.update, piece)
        at, self.submitted = self.submitted, self.submitted + length
        self.inflight[self.current] = self.io.submit(self._write_out, buffer, at, length, self.fill)
        self.current = (self.current + 1) % len(self.buffers)
        self.fill = 0
        self._wait(self.current)

    def _wait(self, index: int) -> None:
        hashing, self.hashes[index] = self.hashes[index], None
        if hashing is not None:
            started = time.perf_counter()
            hashing.result()
            self.hash_seconds += time.perf_counter() - started
        pending, self.inflight[index] = self.inflight[index], None
        if pending is None:
            return
        started = time.perf_counter()
        try:
            self.written += pending.result()
        except OSError as err:
            self.error = self.error or err
            raise
        finally:
            self.wait_seconds += time.perf_counter() - started
        if self.progress is not None:
            self.progress(self.written)

    def _write_out(self, buffer: mmap.mmap, at: int, length: int, payload: int) -> int:
        """Writer thread: `length` aligned bytes of `buffer` at offset `at` (the first `payload`
        bytes are the file's, the rest pads the last block)."""
        view, done = memoryview(buffer), 0
        while done < length:
            try:
                n = os.pwrite(self.fd, view[done:length], at + done)
            except OSError as err:
                if err.errno != errno.EINVAL or not self.direct:
                    raise
                self._buffered()  # the filesystem opened O_DIRECT but refuses its writes
                continue
            if n == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            done += n
        return payload

    def _buffered(self) -> None:
        self.direct = False
        flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~getattr(os, "O_DIRECT", 0))

    def finish(self) -> None:
        """The last partial buffer (padded to the alignment), then the file cut to its size."""
        if self.fill:
            buffer, _ = self.buffers[self.current]
            padded = -(-self.fill // ALIGN) * ALIGN
            buffer[self.fill : padded] = bytes(padded - self.fill)
            self._submit(padded)
        for index in range(len(self.buffers)):
            self._wait(index)
        try:
            os.ftruncate(self.fd, self.offset)
        except OSError as err:
            self.error = self.error or err
            raise

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.io.shutdown(wait=True)  # a failed save: no write still using the buffers
        if self.hasher is not None:
            self.hasher.shutdown(wait=True)
