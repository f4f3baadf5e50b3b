"""Durable writes: a file's bytes and a directory's new entries survive a crash of this host.

A new file is durable once it is fsynced and so is its directory (the entry); a replaced file is
written aside and renamed over the old one, so readers see the old or the new file, never half.
An fsync of a descriptor a caller is writing stays in that caller; the path-level steps are here.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory after a rename in it; errors are raised."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Make a new directory entry durable (a no-op where the filesystem cannot fsync a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file_or_dir(path: Path) -> None:
    """fsync `path`; a directory on a filesystem that cannot fsync one is left as it is."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        if not path.is_dir():
            raise
    finally:
        os.close(fd)


def write_synced(path: Path, text: str, mode: int = 0o666, exclusive: bool = False) -> None:
    """Create (or truncate) `path`, write `text`, fsync it. `exclusive`: FileExistsError when
    `path` exists (O_EXCL: the one creator wins)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    with os.fdopen(os.open(path, flags, mode), "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def create_empty(path: Path, mode: int = 0o644) -> None:
    """An empty file and its directory entry, both durable (a marker whose existence matters)."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, mode)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_path(path.parent)


def replace_atomically(
    path: Path, text: str, mode: int = 0o640, durable: bool = True, exact_mode: bool = False
) -> None:
    """Write a temp file beside `path`, (fsync,) rename it over `path`. Created with `mode` at
    most (the umask may take more); `exact_mode`: whatever the umask, and even when an old temp
    file of this process is reused (a secrets file must never be readable by others)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    if exact_mode:
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            raise
    with os.fdopen(fd, "w") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def in_parallel(job: Callable[[T], object], items: Iterable[T], workers: int = 8) -> None:
    """`job` (file writes, little Python) on every item, on a few threads: on a busy or network
    filesystem each file creation or fsync can wait milliseconds; the waits overlap. The first
    failure is raised (after the others finished)."""
    listed = list(items)
    if len(listed) < 2:
        for item in listed:
            job(item)
        return
    with ThreadPoolExecutor(max_workers=min(workers, len(listed))) as pool:
        for future in [pool.submit(job, item) for item in listed]:
            future.result()


def persist(paths: Iterable[Path]) -> None:
    """fsync every path (files, and directories for their new entries), side by side: concurrent
    fsyncs share the filesystem's journal commits, and unlike sync/syncfs nobody else's unwritten
    data is waited for."""
    in_parallel(fsync_file_or_dir, sorted(set(paths)), workers=16)
