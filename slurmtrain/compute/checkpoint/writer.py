"""The checkpoint engine DeepSpeed writes through (compute node): each rank owns its files.

DeepSpeed hands every shard to `engine.checkpoint_engine.save(state, path)`. This engine
- writes, fsyncs and hashes the shard on the rank that produced it (no rank re-reads another's files);
- keeps a disk error (ENOSPC, EIO...) instead of raising it: DeepSpeed's `save_checkpoint` runs
  barriers between shards, and a rank leaving it early would hang or desynchronise the others; the
  ranks agree on the outcome afterwards;
- in deferred (async) mode only copies the state into host memory (a reused buffer pool, pinned on
  GPUs, views and shared storages preserved like `torch.save` does) and writes it later, from a
  background thread, with `flush()`. Once the run's optimizer has been seen stepping through
  torch's optimizer step hooks, even the copy leaves the loop: `save` only lays out the buffers,
  the background thread copies, and the next optimizer step (the first write to any saved tensor)
  waits for the copy in a global step pre-hook, or does it itself if the thread has not started.
"""

from __future__ import annotations

import copy
import ctypes
import errno
import os
import threading
import time
import weakref
from typing import Any, Callable, Optional

import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
from torch.optim.optimizer import register_optimizer_step_pre_hook

from slurmtrain.compute.checkpoint.format import CHECKSUM, Crc32

Hook = Callable[[int, str], None]  # (step, file name) after each shard is on disk
Progress = Callable[[int], None]  # bytes this rank wrote in the current save so far, per chunk
_ATOMS = (str, bytes, int, float, bool, complex, type(None))


class HostPool:
    """Host copies of tensors, into buffers reused from one save to the next.

    A fresh host allocation costs page faults (measured here: 0.6-1.0 s for 500 MB against 0.14 s
    into a reused buffer), and pinned allocations on GPUs are slower still. Saves repeat the same
    storages in the same order, so buffer `i` of one save fits buffer `i` of the next.
    """

    def __init__(self) -> None:
        self.buffers: list[torch.UntypedStorage] = []
        self.used = 0
        self.storages: dict[tuple[str, int], torch.UntypedStorage] = {}
        self.cuda = False
        self.lazy = False  # copy later, in `run` (from the writer's thread or the step hook)
        self.tasks: list[tuple[torch.UntypedStorage, torch.UntypedStorage, bool]] = []
        self.lock = threading.Lock()

    def begin(self, lazy: bool = False) -> None:
        self.run()  # a copy still pending (a save given up) never outlives its save
        self.used, self.storages, self.lazy = 0, {}, lazy

    @property
    def pending(self) -> bool:
        return bool(self.tasks)

    def run(self) -> None:
        """Do the copies `tensor` deferred (lazy mode); whoever comes second waits for the first."""
        with self.lock:
            tasks, self.tasks = self.tasks, []
            for host, source, gpu in tasks:
                host.copy_(source, non_blocking=gpu)
            if tasks:
                self.sync()

    def _buffer(self, nbytes: int, pinned: bool) -> torch.UntypedStorage:
        i = self.used
        self.used += 1
        if i < len(self.buffers) and self.buffers[i].nbytes() == nbytes:
            return self.buffers[i]
        buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).untyped_storage()
        if i < len(self.buffers):
            self.buffers[i] = buffer
        else:
            self.buffers.append(buffer)
        return buffer

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_sparse or t.is_quantized or type(t) not in (torch.Tensor, torch.nn.Parameter):
            return t.detach().to("cpu", copy=True)
        source = t.untyped_storage()
        key = (str(t.device), source.data_ptr())
        host = self.storages.get(key)
        if host is None:
            gpu = t.device.type != "cpu"
            self.cuda |= t.device.type == "cuda"
            host = self._buffer(source.nbytes(), pinned=gpu and torch.cuda.is_available())
            if self.lazy:
                self.tasks.append((host, source, gpu))
            else:
                host.copy_(source, non_blocking=gpu)
            self.storages[key] = host
        out = torch.empty(0, dtype=t.dtype).set_(host, t.storage_offset(), t.size(), t.stride())
        if isinstance(t, torch.nn.Parameter):
            return torch.nn.Parameter(out, requires_grad=t.requires_grad)
        return out.requires_grad_(t.requires_grad) if t.is_floating_point() else out

    def copy(self, obj: Any) -> Any:
        """A deep copy of a state dict whose tensors all live in host memory."""
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, _ATOMS):
            return obj
        if isinstance(obj, dict):
            out = obj.__class__() if type(obj) is not dict else {}
            for key, value in obj.items():
                out[key] = self.copy(value)
            if getattr(obj, "__dict__", None):  # e.g. state_dict()._metadata (module versions)
                out.__dict__.update(copy.deepcopy(obj.__dict__))
            return out
        if isinstance(obj, list):
            return [self.copy(v) for v in obj]
        if isinstance(obj, tuple):
            items = [self.copy(v) for v in obj]
            return obj.__class__(*items) if hasattr(obj, "_fields") else obj.__class__(items)
        return copy.deepcopy(obj)  # small objects (loss scaler, fragment maps, namespaces)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def free_bytes(path: str) -> Optional[int]:
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    except OSError:
        return None


_WINDOW = 64 << 20  # bytes per write call and per writeback window
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
    """What torch.save writes into: its records arrive whole (tensor storages without a copy) and
    go to the file descriptor in 64 MiB `os.write` calls, hashed on the same buffers (no re-read).

    Each full window is handed to the disk at once (sync_file_range WRITE) and the one two windows
    back waited for (a few windows dirty at most), so the disk writes while the next bytes are
    copied and hashed: the final fsync waits for the last windows only, where `dd conv=fsync`
    waits for all of them. Keeps the OSError.
    """

    def __init__(self, fd: int, hashing: bool, progress: Optional[Progress] = None) -> None:
        self.fd, self.error, self.progress = fd, None, progress
        self.checksum = Crc32() if hashing else None
        self.hash_seconds = 0.0
        self.offset = self.kicked = 0
        self.windows: list[tuple[int, int]] = []  # handed to the disk, not yet waited for
        self.writeback = _SYNC_RANGE

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            try:
                n = os.write(self.fd, view[done : done + _WINDOW])
                if n == 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError as err:
                self.error = err
                raise
            if self.checksum is not None:
                started = time.perf_counter()
                self.checksum.update(view[done : done + n])
                self.hash_seconds += time.perf_counter() - started
            done += n
            self.offset += n
            if self.offset - self.kicked >= _WINDOW:
                self._kick()
            if self.progress is not None:
                self.progress(self.offset)
        return done

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
            self.writeback(self.fd, start, length, wait)

    def flush(self) -> None:
        pass


def _torch_save(state: Any, sink: _RawFile, zipfile_serialization: bool) -> None:
    """torch.save without the zip records' own CRC-32 (a second pass over every byte, in miniz):
    the manifest's checksum covers the whole file. The file stays a plain torch.load file."""
    config = getattr(getattr(torch.utils, "serialization", None), "config", None)
    if config is None or not zipfile_serialization:
        torch.save(state, sink, _use_new_zipfile_serialization=zipfile_serialization)
        return
    with _SAVE_CONFIG, config.patch({"save.compute_crc32": False}):
        torch.save(state, sink)


_WRITERS: "weakref.WeakSet[ShardWriter]" = weakref.WeakSet()
_HOOK: list[Any] = []  # the global optimizer step pre-hook's handle, registered once


def _before_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """Every optimizer step of the process: no saved tensor changes before its copy is taken."""
    for writer in list(_WRITERS):
        writer.steps_seen += 1
        if writer.pool.pending:
            started = time.perf_counter()
            writer.pool.run()
            writer.seconds["step_wait"] += time.perf_counter() - started


class ShardWriter(TorchCheckpointEngine):
    """One rank's writer for one save at a time: `begin`, DeepSpeed's saves, `flush`, `report`."""

    def __init__(
        self,
        zipfile_serialization: bool,
        verify: str,
        hook: Optional[Hook] = None,
        progress: Optional[Progress] = None,
    ):
        super().__init__(None)
        self.zipfile_serialization = zipfile_serialization
        self.verify, self.hook, self.progress = verify, hook, progress
        self.pool = HostPool()
        self.steps_seen = 0  # optimizer steps the global pre-hook saw: it guards lazy copies
        self.begin(0, "", deferred=False)
        _WRITERS.add(self)
        if not _HOOK:
            _HOOK.append(register_optimizer_step_pre_hook(_before_optimizer_step))

    def begin(self, step: int, directory: str, deferred: bool) -> None:
        self.step, self.directory, self.deferred = step, directory, deferred
        self.pending: list[tuple[Any, str]] = []
        self.files: dict[str, dict[str, Any]] = {}
        self.error: Optional[str] = None
        self.written = 0  # bytes this rank wrote in this save (what `progress` is told)
        # where this rank's save went; step_wait: the loop's next optimizer step waited for the copy
        self.seconds = {"serialize": 0.0, "hash": 0.0, "fsync": 0.0, "copy": 0.0, "step_wait": 0.0}
        self.pool.begin(lazy=deferred and self.steps_seen > 0)

    def _fail(self, err: BaseException, path: str) -> None:
        if self.error is None:
            free = free_bytes(os.path.dirname(path) or ".")
            where = f" ({free:,} bytes free there)" if free is not None else ""
            self.error = f"writing {os.path.basename(path)}: {type(err).__name__}: {err}{where}"

    def create(self, info: Any) -> None:  # DeepSpeed's per-save notice; nothing to prepare
        pass

    def commit(self, info: Any) -> bool:
        return True

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        try:
            os.makedirs(path, exist_ok=exist_ok)
        except OSError as err:
            self._fail(err, path)

    def save(self, state_dict: Any, path: str) -> None:
        if self.error is not None:
            return
        if self.deferred:
            self.pending.append((self.pool.copy(state_dict), path))
        else:
            self._write(state_dict, path)

    def load(self, path: str, map_location: Any = None) -> Any:
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
        return torch.load(path, map_location=map_location, weights_only=False)

    def host_copy_done(self) -> None:
        """Called on the main thread when DeepSpeed is done: device-to-host copies complete
        (lazy mode: they have not started; the writer's thread or the next optimizer step runs them)."""
        if not self.pool.lazy:
            self.pool.sync()

    def _write(self, state: Any, path: str) -> None:
        sink: Optional[_RawFile] = None
        before = self.written
        progress = None if self.progress is None else lambda n: self.progress(before + n)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                sink = _RawFile(fd, self.verify == "checksum", progress)
                started = time.perf_counter()
                _torch_save(state, sink, self.zipfile_serialization)
                written = time.perf_counter()
                os.fsync(fd)
                self.seconds["fsync"] += time.perf_counter() - written
                self.seconds["serialize"] += written - started - sink.hash_seconds
                self.seconds["hash"] += sink.hash_seconds
            finally:
                os.close(fd)
            entry: dict[str, Any] = {"size": os.path.getsize(path)}
            if sink.checksum is not None:
                entry[CHECKSUM] = sink.checksum.hexdigest()
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

    def report(self, rank: int) -> dict[str, Any]:
        return {
            "rank": rank,
            "ok": self.error is None,
            "error": self.error,
            "files": self.files,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
        }
