"""JSON-lines files of a run directory: one writer per file, readers that merge them in time order.

One shared `ledger.jsonl` is unsafe on NFS (O_APPEND is emulated per client: two hosts can
overwrite each other's lines), so the ledger has two tiers of single-writer files:
- Run tier, `ledger.d/<host>.<pid>.<token>.jsonl`: one file per process writing for the whole run
  (login node, supervisor, `cancel`, rank 0). The random per-process token keeps a recycled pid
  from appending to a dead process's file.
- Rank tier, `ledger.d/ranks/<job_id>.<restart>.<relaunch>/<node>.jsonl`: rows any rank writes,
  one file per node per attempt key (512 files for a 512 x 8 failure, not 4,096). Each row is one
  O_APPEND write (atomic among one host's processes) starting with "\n", so a line torn by a
  killed writer is ended by the next row instead of swallowing it.

Durability: run-tier `FATE_EVENTS` are fsynced with their new directory entries; in the rank tier
only the creator of a node file fsyncs it (O(nodes) fsyncs per failure): a later row is lost only
with its host, which Slurm's node state reports anyway.

Readers read one file at a time (in bounded blocks, common/jsonl_lines.py) and merge in memory.
What cannot be read (an unreadable file or directory, a bad or oversized line, a row without
`event`) is skipped and counted, and the command says so in one warning line (common/read_skips.py);
an unterminated last line is a writer mid-append and is skipped quietly. Old run directories (one
`ledger.jsonl`) still read: they are run-tier files.
"""

from __future__ import annotations

import heapq
import json
import os
import re
import secrets
import socket
from pathlib import Path
from typing import Iterable, Mapping, Optional, TypeVar

from slurmtrain.common import read_skips
from slurmtrain.common.durable import fsync_dir
from slurmtrain.common.events import REGISTRY, Row, parse
from slurmtrain.common.jsonl_lines import MAX_LINE as MAX_LINE  # readers import them from here
from slurmtrain.common.jsonl_lines import iter_jsonl as iter_jsonl
from slurmtrain.common.jsonl_lines import numbered, why
from slurmtrain.common.jsonl_lines import tail_jsonl as tail_jsonl

# fsynced before record() returns
FATE_EVENTS = frozenset(kind for kind, cls in REGISTRY.items() if cls.durable)

_token = secrets.token_hex(3)
_token_pid = os.getpid()
_created: set[str] = set()

RowT = TypeVar(
    "RowT", dict[str, object], Row, Mapping[str, object]
)  # a file's dict, or a ledger row object

LEGACY_LEDGER, LEDGER_DIR, RANKS_DIR = "ledger.jsonl", "ledger.d", "ranks"


def run_tier_files(run_path: Path) -> list[Path]:
    """The run tier of a run directory's ledger: the old single file first (if any), then the
    per-process files of `ledger.d/` (old runs' per-rank failure files among them)."""
    run_path = Path(run_path)
    legacy = [run_path / LEGACY_LEDGER] if os.path.isfile(run_path / LEGACY_LEDGER) else []
    return legacy + _jsonl_in(run_path / LEDGER_DIR)


def rank_key(job_id: object, restart: int = 0, relaunch: int = 0) -> str:
    """The rank tier's folder name of one attempt key (job id, restart count, relaunch)."""
    return f"{_safe(str(job_id))}.{int(restart)}.{int(relaunch)}"


def rank_tier_files(run_path: Path, key: Optional[str] = None) -> list[Path]:
    """The node files of one attempt key's folder (`rank_key`), or of every folder (None)."""
    ranks = Path(run_path) / LEDGER_DIR / RANKS_DIR
    keys = [key] if key is not None else sorted(rank_keys(run_path))
    return [p for k in keys for p in _jsonl_in(ranks / k)]


def rank_keys(run_path: Path) -> set[str]:
    """The attempt keys (folder names, `rank_key`) that have rank-tier rows: one directory read."""
    where = Path(run_path) / LEDGER_DIR / RANKS_DIR
    try:
        return {e.name for e in os.scandir(where) if e.is_dir()}
    except (FileNotFoundError, NotADirectoryError):
        return set()
    except OSError as err:  # another user's 0700 directory
        read_skips.skip(where, 0, why(err))
        return set()


def _jsonl_in(directory: Path) -> list[Path]:
    try:
        names = sorted(e.name for e in os.scandir(directory) if e.name.endswith(".jsonl"))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as err:  # another user's 0700 directory
        read_skips.skip(directory, 0, why(err))
        return []
    return [directory / n for n in names]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_+@-]", "_", name) or "_"


def read_jsonl(path: Path) -> list[dict[str, object]]:
    """Every row of one JSON-lines file (metrics, bad nodes, an old single-file ledger).

    Given a run's `ledger.jsonl` next to a `ledger.d/`, the whole merged ledger comes back (what
    `RunDir.events()` returns): code that still reads `run.ledger` never sees half of it."""
    path = Path(path)
    if path.name == LEGACY_LEDGER and (path.parent / LEDGER_DIR).is_dir():
        return [r.to_json() for r in ledger_rows(path.parent)]
    return list(iter_jsonl(path))


def _time(row: Mapping[str, object] | Row) -> float:
    t = row.time if isinstance(row, Row) else row.get("time")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0


def ledger_rows(run_path: Path) -> list[Row]:
    """A run directory's whole ledger, both tiers, in time order, as row objects."""
    ranks = merge_ledger(rank_tier_files(run_path), shared=True)
    return merge_rows([merge_ledger(run_tier_files(run_path)), ranks])


def merge_ledger(paths: Iterable[Path], shared: bool = False) -> list[Row]:
    """Ledger files merged as `merge_jsonl` merges them, each row parsed (events.parse: the one
    place old or odd rows are handled)."""
    lists = [_ledger_file(p) for p in paths]
    if shared:
        lists = [sorted(rows, key=_time) for rows in lists]
    return [parse(r) for r in merge_rows(lists)]


def _ledger_file(path: Path) -> list[dict[str, object]]:
    """One ledger file's rows; a row without an `event` name is noted and skipped (read_skips)."""
    rows = []
    for lineno, row in numbered(path):
        kind = row.get("event")
        if isinstance(kind, str) and kind:
            rows.append(row)
        else:
            read_skips.skip(path, lineno, "a row without an event name")
    return rows


def merge_jsonl(paths: Iterable[Path], shared: bool = False) -> list[dict[str, object]]:
    """Rows of several files in time order; each file's own order is kept (a clock step inside
    one writer never reorders its rows), ties keep the order of `paths`. One file is open at a
    time (each is read whole first): 4,096 files need no more descriptors than one. `shared`:
    files several processes append to (the rank tier), whose order is arrival order: each is
    sorted by time first (stable)."""
    if shared:
        return merge_rows([sorted(iter_jsonl(p), key=_time) for p in paths])
    return merge_rows([list(iter_jsonl(p)) for p in paths])


def merge_rows(lists: Iterable[list[RowT]]) -> list[RowT]:
    """Lists of rows merged as `merge_jsonl` merges files (each list's order kept, ties in order)."""
    nonempty = [rows for rows in lists if rows]
    if len(nonempty) == 1:
        return list(nonempty[0])
    return list(heapq.merge(*nonempty, key=_time))


def writer_name() -> str:
    """This process's file name in a per-writer directory: host, pid and a per-process token."""
    global _token, _token_pid
    if os.getpid() != _token_pid:  # a forked child writes its own file, not its parent's
        _token, _token_pid = secrets.token_hex(3), os.getpid()
    return f"{socket.gethostname()}.{os.getpid()}.{_token}.jsonl"


def append_jsonl(path: Path, row: Mapping[str, object], durable: bool = False) -> None:
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
        _write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    if new:
        fsync_dir(path.parent)


def _write_all(fd: int, data: bytes) -> None:
    """All of `data`, in one write(2) when the kernel takes it whole (always, below a page of a
    local file); a short write (disk full, a signal) is finished rather than left torn."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def append_own(directory: Path, row: Mapping[str, object], durable: bool = False) -> Path:
    """Append to this process's own file in `directory` (created on first use): one writer a file."""
    path = directory / writer_name()
    if str(path) not in _created:
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            fsync_dir(directory.parent)
        _created.add(str(path))
    append_jsonl(path, row, durable=durable)
    return path


def append_rank_row(run_path: Path, key: str, node: str, row: Mapping[str, object]) -> Path:
    """Append one row to this node's file of attempt key `key` in the rank tier (module
    docstring): one O_APPEND write of a whole line; the process that creates the file fsyncs it
    and the directory entries it made (O(nodes) fsyncs per failure), later rows are not fsynced."""
    directory = Path(run_path) / LEDGER_DIR / RANKS_DIR / key
    path = directory / f"{_safe(node)}.jsonl"
    # The leading newline ends a line torn by a writer killed mid-write (an empty line between
    # whole rows is skipped): with several writers, reading the last byte first would race.
    data = ("\n" + json.dumps(row, default=str) + "\n").encode()
    created = _makedirs_durable(directory)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        created.append(directory)
    except FileExistsError:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        _write_all(fd, data)  # one write: never interleaved with another process's
        if created:
            os.fsync(fd)
    finally:
        os.close(fd)
    for made in created:
        fsync_dir(made)
    return path


def _makedirs_durable(directory: Path) -> list[Path]:
    """mkdir -p; returns the parents whose new entries this call made (to fsync them)."""
    if directory.is_dir():
        return []
    made: list[Path] = []
    for d in reversed([directory, *directory.parents]):
        if d.is_dir():
            continue
        try:
            d.mkdir()
            made.append(d.parent)
        except FileExistsError:
            pass
    return made


def as_number(value: object, default: float = 0.0) -> float:
    """A field of a plain row (metrics, bad nodes) as a number: `default` when null or not one."""
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            return default
    return default


def as_integer(value: object) -> Optional[int]:
    """A field of a plain row as an integer: None when null or not one."""
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return int(value)
        except (ValueError, OverflowError):
            return None
    return None
