"""JSON-lines files the run directory keeps: one writer per file, readers that merge and report.

The run ledger is written from many places at once: every rank that sees a failure, rank 0, the
batch-shell supervisor, the login node (`submitted`, `cancelled`). A single `ledger.jsonl` appended
with O_APPEND by all of them is only safe on a local filesystem: on NFS, O_APPEND is emulated by
each client (seek to the size it believes, then write), so two hosts appending at once can overwrite
or interleave each other's lines, and nothing was fsynced, so a crash of the writer's host could
lose the event that decided the run's fate.

Design chosen: **one file per writing process** (`ledger.d/<host>.<pid>.<token>.jsonl`), merged by
readers in time order. Why this and not "rank 0 alone writes, others write failure files": the
writers that are not rank 0 (the supervisor, the login node, `cancel`, a failing rank, the watchdog
of a hung rank) run on other hosts and at moments rank 0 cannot know about, so "rank 0 alone" still
needs a merge for everything else; one rule for every writer is simpler to prove. With one writer
per file no byte of any file is ever written by two processes, so nothing can interleave on any
filesystem, and the file name alone says who wrote it. The token (random per process, drawn again
after a fork) keeps a recycled pid from appending to a dead process's file, where the dead writer's
torn last line would swallow the first new row.

Durability: events that decide the run's fate (`FATE_EVENTS`) are fsynced, and so is the directory
entry of a file they create; others (metrics-like events) are not. Readers: a line that does not
parse is reported once per process as a warning naming the file and line, never dropped silently;
the last line of a file without its newline is a writer mid-append (or killed mid-append) and is
skipped quietly. A run directory from before this change (one `ledger.jsonl`) still reads: that file
is merged like any other.
"""

from __future__ import annotations

import heapq
import json
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator

# Events whose loss would change what the run does next: fsynced before record() returns.
FATE_EVENTS = frozenset(
    {
        "submitted",
        "submit_intent",
        "submit_confirmed",
        "started",
        "attempt_ended",
        "stopped",
        "finished",
        "failed",
        "signal",
        "requeued",
        "rollback",
        "diverged",
        "checkpoint_saved",
        "checkpoint_unreadable",
        "duplicate_refused",
        "cancelled",
        "node_lost",
        "bad_node",
    }
)

_reported: set[tuple[str, int]] = set()
_token = secrets.token_hex(3)
_token_pid = os.getpid()
_created: set[str] = set()


def _warn_corrupt(path: Path, lineno: int, err: str) -> None:
    key = (str(path), lineno)
    if key in _reported:
        return
    _reported.add(key)
    print(
        f"slurmtrain: warning: {path}:{lineno}: unreadable line skipped ({err}); "
        f"the rest of the file is read",
        file=sys.stderr,
    )


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Every JSON object line of one file, in file order (see the module docstring for bad lines)."""
    try:
        f = open(path, "rb")
    except (FileNotFoundError, NotADirectoryError):
        return
    with f:
        lineno = 0
        for raw in f:
            lineno += 1
            if not raw.endswith(b"\n"):
                # The last line, without its newline: a writer mid-append. Complete JSON is kept
                # (a hand-written file without a final newline), a torn row skipped quietly.
                try:
                    row = json.loads(raw)
                except ValueError:
                    return
                if isinstance(row, dict):
                    yield row
                return
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError as err:  # UnicodeDecodeError is a ValueError too
                _warn_corrupt(path, lineno, f"{type(err).__name__}: {err}")
                continue
            if isinstance(row, dict):
                yield row
            else:
                _warn_corrupt(path, lineno, f"a JSON {type(row).__name__}, not an object")


LEGACY_LEDGER, LEDGER_DIR = "ledger.jsonl", "ledger.d"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every row of one JSON-lines file (metrics, bad nodes, an old single-file ledger).

    Given a run's `ledger.jsonl` next to a `ledger.d/`, the whole merged ledger comes back (what
    `RunDir.events()` returns): code that still reads `run.ledger` never sees half of it."""
    path = Path(path)
    if path.name == LEGACY_LEDGER and (path.parent / LEDGER_DIR).is_dir():
        own = sorted(p for p in (path.parent / LEDGER_DIR).iterdir() if p.name.endswith(".jsonl"))
        return merge_jsonl([path, *own])
    return list(iter_jsonl(path))


def _time(row: dict[str, Any]) -> float:
    t = row.get("time")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0


def merge_jsonl(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Rows of several files in time order; each file's own order is kept (a clock step inside
    one writer never reorders its rows), ties keep the order of `paths`."""
    return list(heapq.merge(*(iter_jsonl(p) for p in paths), key=_time))


def writer_name() -> str:
    """This process's file name in a per-writer directory: host, pid and a per-process token."""
    global _token, _token_pid
    if os.getpid() != _token_pid:  # a forked child writes its own file, not its parent's
        _token, _token_pid = secrets.token_hex(3), os.getpid()
    return f"{socket.gethostname()}.{os.getpid()}.{_token}.jsonl"


def append_jsonl(path: Path, row: dict[str, Any], durable: bool = False) -> None:
    """Append one line with one write() (O_APPEND), all of it; `durable`: fsync the file, and the
    directory too when this call created the file. For files with one writer at a time (metrics,
    a process's own ledger file); a torn last line left by a dead writer is ended first."""
    data = (json.dumps(row, default=str) + "\n").encode()
    new = durable and not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            # The previous writer died mid-line (metrics.jsonl of a killed attempt): end its torn
            # line first, or this row would be glued to it and lost with it.
            data = b"\n" + data
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    if new:
        fsync_dir(path.parent)


def append_own(directory: Path, row: dict[str, Any], durable: bool = False) -> Path:
    """Append to this process's own file in `directory` (created on first use): one writer a file."""
    path = directory / writer_name()
    if str(path) not in _created:
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            fsync_dir(directory.parent)
        _created.add(str(path))
    append_jsonl(path, row, durable=durable)
    return path


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
