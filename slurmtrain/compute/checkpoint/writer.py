"""The checkpoint engine DeepSpeed writes through (compute node): each rank owns its files.

DeepSpeed hands every shard to `engine.checkpoint_engine.save(state, path)`. This engine
- under ZeRO-1/2 leaves the module weights out of the model-states file (module_states.py);
- writes, fsyncs and hashes each shard on the rank that produced it, with O_DIRECT from reused
  aligned buffers (direct_io.py), or through the page cache (`_RawFile`) where O_DIRECT is refused;
- keeps a disk error (ENOSPC, EIO...) instead of raising it: `save_checkpoint` runs barriers
  between shards, and a rank leaving early would hang the others; the ranks agree afterwards;
- in deferred (async) mode copies the state into reused host buffers (pinned on GPUs, shared
  storages preserved as `torch.save` does) and writes it later from a background thread (`flush`).
  Once the optimizer has been seen stepping, even the copy leaves the loop: `save` only lays out
  the buffers, and the next optimizer step (the first write to a saved tensor) waits for the copy
  in a global step pre-hook, or does it itself.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Optional, Union

import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
from torch.optim.optimizer import register_optimizer_step_pre_hook

from slurmtrain.common.checkpoint_format import Crc32
from slurmtrain.compute.checkpoint import direct_io, module_states, safe_load
from slurmtrain.compute.checkpoint.hostpool import HostPool
from slurmtrain.compute.checkpoint.markers import FileEntry, RankReport

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

Hook = Callable[[int, str], None]  # (step, file name) after each shard is on disk
Progress = Callable[[int], None]  # bytes this rank wrote in the current save so far, per chunk


def free_bytes(path: str) -> Optional[int]:
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    except OSError:
        return None


_WINDOW = 64 << 20  # bytes per writeback window
_CHUNK = 16 << 20  # bytes per write call and per hashed piece
_SYNC_WAIT_BEFORE, _SYNC_WRITE, _SYNC_WAIT_AFTER = 1, 2, 4
_SAVE_CONFIG = threading.Lock()  # torch's serialization config is process-wide


def _sync_file_range() -> Optional[Callable[..., int]]:
    """Linux's sync_file_range(2), or None (then writeback starts at fsync, like dd's)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return call


_SYNC_RANGE = _sync_file_range()


class _RawFile:
    """What torch.save writes into, through the page cache: records go to the file descriptor in
    16 MiB `os.write` calls, hashed on the same buffers (no re-read).

    A chunk's CRC-32 runs on a helper thread while the next is written (both release the GIL): a
    save costs max(write, hash). A record's memory is only borrowed for the call, so `write`
    returns once its chunks are hashed. Each full 64 MiB window is handed to the disk at once
    (sync_file_range WRITE) and the one two windows back waited for, so the final fsync waits for
    the last windows only. Keeps the OSError.
    """

    def __init__(self, fd: int, hashing: bool, progress: Optional[Progress] = None) -> None:
        self.fd, self.progress = fd, progress
        self.error: Optional[OSError] = None
        self.checksum = Crc32() if hashing else None
        self.hasher = ThreadPoolExecutor(1, "checkpoint-crc") if hashing else None
        self.hash_seconds = 0.0  # time `write` waited for hashing (what overlap did not hide)
        self.write_seconds = 0.0  # in os.write: the kernel copying into the page cache
        self.wait_seconds = 0.0  # waiting for the disk to take the window two back
        self.offset = self.kicked = 0
        self.windows: list[tuple[int, int]] = []  # handed to the disk, not yet waited for
        self.writeback = _SYNC_RANGE

    def write(self, data: direct_io.Bytes) -> int:
        view = memoryview(data).cast("B")
        if self.checksum is not None and len(view) < _CHUNK:  # headers, pickle: hash inline
            self._write(view)
            started = time.perf_counter()
            self.checksum.update(view)
            self.hash_seconds += time.perf_counter() - started
            return len(view)
        pending: Optional[Future[None]] = None
        try:
            done = 0
            while done < len(view):
                chunk = view[done : done + _CHUNK]
                n = self._write(chunk)
                if self.hasher is not None and self.checksum is not None:
                    pending = self.hasher.submit(self.checksum.update, chunk[:n])
                done += n
            return done
        finally:
            if pending is not None:  # one worker, in order: the last one done means all done
                started = time.perf_counter()
                pending.result()
                self.hash_seconds += time.perf_counter() - started

    def _write(self, chunk: memoryview) -> int:
        started = time.perf_counter()
        try:
            n = os.write(self.fd, chunk)
            if n == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as err:
            self.error = err
            raise
        self.write_seconds += time.perf_counter() - started
        self.offset += n
        if self.offset - self.kicked >= _WINDOW:
            self._kick()
        if self.progress is not None:
            self.progress(self.offset)
        return n

    def close(self) -> None:
        if self.hasher is not None:
            self.hasher.shutdown(wait=True)

    def _kick(self) -> None:
        if self.writeback is None:
            return
        window = (self.kicked, self.offset - self.kicked)
        self.kicked = self.offset
        if self.writeback(self.fd, *window, _SYNC_WRITE) != 0:
            self.writeback = None  # not supported here (e.g. some network filesystems)
            return
        self.windows.append(window)
        if len(self.windows) > 2:
            start, length = self.windows.pop(0)
            wait = _SYNC_WAIT_BEFORE | _SYNC_WRITE | _SYNC_WAIT_AFTER
            started = time.perf_counter()
            self.writeback(self.fd, start, length, wait)
            self.wait_seconds += time.perf_counter() - started

    def flush(self) -> None:
        pass


def _torch_save(
    state: object, sink: Union[_RawFile, direct_io.DirectFile], zipfile_serialization: bool
) -> None:
    """torch.save without the zip records' own CRC-32 (a second pass over every byte, in miniz):
    the manifest's checksum covers the whole file. The file stays a plain torch.load file."""
    config = getattr(getattr(torch.utils, "serialization", None), "config", None)
    if config is None or not zipfile_serialization:
        torch.save(state, sink, _use_new_zipfile_serialization=zipfile_serialization)
        return
    with _SAVE_CONFIG, config.patch({"save.compute_crc32": False}):
        torch.save(state, sink)


_WRITERS: "weakref.WeakSet[ShardWriter]" = weakref.WeakSet()
_HOOK: list[RemovableHandle] = []  # the global optimizer step pre-hook's handle, registered once


def _before_optimizer_step(
    optimizer: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    """Every optimizer step of the process: no saved tensor changes before its copy is taken."""
    for writer in list(_WRITERS):
        writer.steps_seen += 1
        if writer.pool.pending:
            started = time.perf_counter()
            writer.pool.run()
            writer.seconds["step_wait"] += time.perf_counter() - started


class ShardWriter(TorchCheckpointEngine):  # type: ignore[misc]  # deepspeed is not followed
    """One rank's writer for one save at a time: `begin`, DeepSpeed's saves, `flush`, `report`."""

    def __init__(
        self,
        zipfile_serialization: bool,
        verify: str,
        hook: Optional[Hook] = None,
        progress: Optional[Progress] = None,
        direct: bool = True,
    ):
        super().__init__(None)
        self.zipfile_serialization = zipfile_serialization
        self.verify, self.hook, self.progress = verify, hook, progress
        self.pool = HostPool()
        self.direct = direct  # O_DIRECT where the filesystem takes it (direct_io.py)
        self.buffers = direct_io.Buffers()  # its aligned buffers, mapped at the first save
        self.steps_seen = 0  # optimizer steps the global pre-hook saw: it guards lazy copies
        self.begin(0, "", deferred=False)
        _WRITERS.add(self)
        if not _HOOK:
            _HOOK.append(register_optimizer_step_pre_hook(_before_optimizer_step))

    def begin(self, step: int, directory: str, deferred: bool) -> None:
        self.step, self.directory, self.deferred = step, directory, deferred
        self.pending: list[tuple[object, str]] = []
        self.files: dict[str, FileEntry] = {}
        self.error: Optional[str] = None
        self.written = 0  # bytes this rank wrote in this save (what `progress` is told)
        # where this rank's save went: serialize (pickling), write (copying into the page cache or
        # the aligned buffers), disk_wait, hash (not hidden by the overlap), fsync, copy (async:
        # to host); step_wait: the loop's next optimizer step waited for the copy
        self.seconds = dict.fromkeys(
            ["serialize", "write", "disk_wait", "hash", "fsync", "copy", "step_wait"], 0.0
        )
        self.pool.begin(lazy=deferred and self.steps_seen > 0)

    def _fail(self, err: BaseException, path: str) -> None:
        if self.error is None:
            free = free_bytes(os.path.dirname(path) or ".")
            where = f" ({free:,} bytes free there)" if free is not None else ""
            self.error = f"writing {os.path.basename(path)}: {type(err).__name__}: {err}{where}"

    def create(self, info: object) -> None:  # DeepSpeed's per-save notice; nothing to prepare
        pass

    def commit(self, info: object) -> bool:
        return True

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        try:
            os.makedirs(path, exist_ok=exist_ok)
        except OSError as err:
            self._fail(err, path)

    def save(self, state_dict: object, path: str) -> None:
        if self.error is not None:
            return
        state_dict = module_states.strip(state_dict, path)  # ZeRO-1/2: the partitions hold them
        if self.deferred:
            self.pending.append((self.pool.copy(state_dict), path))
        else:
            self._write(state_dict, path)

    def load(self, path: str, map_location: Union[str, torch.device, None] = None) -> object:
        """DeepSpeed's loads: the whole file is handed to the kernel's read-ahead first, so the
        disk streams it while torch.load allocates and unpickles (the file is torch.load's own)."""
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
        except (OSError, AttributeError):
            pass  # torch.load reports a missing file; no fadvise: it only reads a little later
        return safe_load.load(path, map_location)  # weights only, DeepSpeed's loads too

    def host_copy_done(self) -> None:
        """Called on the main thread when DeepSpeed is done: device-to-host copies complete
        (lazy mode: they have not started; the writer's thread or the next optimizer step runs them)."""
        if not self.pool.lazy:
            self.pool.sync()

    def _write(self, state: object, path: str) -> None:
        sink: Optional[Union[_RawFile, direct_io.DirectFile]] = None
        before, told = self.written, self.progress
        progress: Optional[Progress] = None if told is None else lambda n: told(before + n)
        try:
            hashing = self.verify == "checksum"
            fd = direct_io.open_direct(path) if self.direct else None
            direct = fd is not None
            if fd is None:  # no O_DIRECT here: through the page cache
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                if direct:
                    sink = direct_io.DirectFile(fd, hashing, progress, self.buffers)
                else:
                    sink = _RawFile(fd, hashing, progress)
                started = time.perf_counter()
                _torch_save(state, sink, self.zipfile_serialization)
                if isinstance(sink, direct_io.DirectFile):
                    sink.finish()
                written = time.perf_counter()
                os.fsync(fd)
                self.seconds["fsync"] += time.perf_counter() - written
                io = sink.hash_seconds + sink.write_seconds + sink.wait_seconds
                self.seconds["serialize"] += written - started - io  # pickling, Python
                self.seconds["write"] += sink.write_seconds
                self.seconds["disk_wait"] += sink.wait_seconds
                self.seconds["hash"] += sink.hash_seconds
            finally:
                if sink is not None:
                    sink.close()
                os.close(fd)
            entry: FileEntry = {"size": os.path.getsize(path)}
            if sink.checksum is not None:
                entry["crc32"] = sink.checksum.hexdigest()  # checkpoint_format.CHECKSUM
        except (OSError, RuntimeError) as err:
            # torch's zip writer turns ENOSPC into "unexpected pos"; the file kept the real error
            self._fail(sink.error if sink is not None and sink.error else err, path)
            self.discard(path)
            return
        self.written = before + entry["size"]
        self.files[os.path.relpath(path, self.directory)] = entry
        if self.hook is not None:
            self.hook(self.step, os.path.basename(path))

    def flush(self) -> None:
        """Write what `save` deferred (background thread); host buffers stay for the next save."""
        started = time.perf_counter()
        self.pool.run()
        self.seconds["copy"] += time.perf_counter() - started
        pending, self.pending = self.pending, []
        for state, path in pending:
            if self.error is None:
                self._write(state, path)
        del pending

    def discard(self, *extra: str) -> None:
        """A failed save: free the space of what this rank wrote (the directory goes anyway)."""
        for path in [*extra, *(os.path.join(self.directory, name) for name in self.files)]:
            try:
                os.unlink(path)
            except OSError:
                pass

    def report(self, rank: int) -> RankReport:
        return {
            "rank": rank,
            "ok": self.error is None,
            "error": self.error,
            "files": self.files,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
        }
