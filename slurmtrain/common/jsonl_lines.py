"""Lines of one JSON-lines file (a ledger file, metrics.jsonl) that no file can knock over.

Read BLOCK bytes at a time: a line over MAX_LINE streams past and is dropped, never held whole
(one 64 MiB `error` once made `status` time out); an unreadable file (another user's 0600 file, a
directory named `*.jsonl`), a line that is not JSON or not an object: each is skipped and noted in
common/read_skips.py, which the command tells in one warning line. The text after the last newline
is a writer mid-append: kept when it is complete JSON, else skipped quietly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

from slurmtrain.common import read_skips

# A line longer than this is skipped as it streams past, never held whole (legitimate rows are
# small: writers cap free text, common/row_codec.py); files are read this much at a time.
MAX_LINE = 1 << 20
BLOCK = 1 << 20


def _open(path: Path) -> Optional[BinaryIO]:
    """`path` opened for reading; None when missing (quietly) or unreadable (noted, read_skips)."""
    try:
        return open(path, "rb")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:  # another user's 0600 file, a directory named *.jsonl, EIO
        read_skips.skip(path, 0, why(err))
        return None


def why(err: OSError) -> str:
    return f"{type(err).__name__}: {err.strerror or err}"


def iter_jsonl(path: Path) -> Iterator[dict[str, object]]:
    """Every JSON object line of one file, in file order (see the module docstring for bad lines).
    The file is read and closed before the first row: readers hold one file open at most."""
    yield from (row for _, row in numbered(path))


def numbered(path: Path) -> list[tuple[int, dict[str, object]]]:
    """(line number, row) of every JSON object line of one file, read BLOCK bytes at a time."""
    f = _open(path)
    if f is None:
        return []
    rows: list[tuple[int, dict[str, object]]] = []
    with f as fh:
        try:
            for lineno, raw, last in _lines(fh, path):
                row = _row(path, lineno, raw, last)
                if row is not None:
                    rows.append((lineno, row))
        except OSError as err:
            read_skips.skip(path, 0, why(err))
    return rows


def _lines(f: BinaryIO, path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, line, is the text after the last newline) of an open file; a line over
    MAX_LINE is noted and dropped as it streams past."""
    pending, lineno, skipping = b"", 1, False
    while block := f.read(BLOCK):
        parts = block.split(b"\n")
        tail = parts.pop()
        for part in parts:
            whole = pending + part
            pending = b""
            if skipping or len(whole) > MAX_LINE:
                read_skips.skip(path, lineno, f"a line over {MAX_LINE:,} bytes")
                skipping = False
            else:
                yield lineno, whole, False
            lineno += 1
        if not skipping:
            pending += tail
            if len(pending) > MAX_LINE:
                pending, skipping = b"", True
    if skipping:
        read_skips.skip(path, lineno, f"a line over {MAX_LINE:,} bytes")
    else:
        yield lineno, pending, True


def _row(path: Path, lineno: int, raw: bytes, last: bool) -> Optional[dict[str, object]]:
    """One line's row (None: blank, or skipped). `last`: the text after the file's last newline,
    a writer mid-append: complete JSON is kept (a hand-written file without a final newline), a
    torn row skipped quietly."""
    if len(raw) > MAX_LINE:
        read_skips.skip(path, lineno, f"a line over {MAX_LINE:,} bytes")
        return None
    if not raw.strip():
        return None
    try:
        row = json.loads(raw)
    except ValueError as err:  # UnicodeDecodeError is a ValueError too
        if not last:
            read_skips.skip(path, lineno, f"{type(err).__name__}: {str(err)[:200]}")
        return None
    except RecursionError:  # [[[[...: nested deeper than the parser goes
        read_skips.skip(path, lineno, "nested too deep")
        return None
    if isinstance(row, dict):
        return row
    if not last:
        read_skips.skip(path, lineno, f"a JSON {type(row).__name__}, not an object")
    return None


def tail_jsonl(path: Path, block: int = 1 << 16) -> Iterator[dict[str, object]]:
    """The rows of one file newest first, read backwards a block at a time: a caller that needs
    the last rows of a multi-GB metrics file reads kilobytes (a torn last line is skipped; a
    line over MAX_LINE is noted and dropped, never held whole)."""
    f = _open(path)
    if f is None:
        return
    with f as fh:
        end = fh.seek(0, os.SEEK_END)
        pending = b""  # the end of a line whose start is in an earlier block
        last = True  # the text after the file's last newline is still to be seen
        skipping = False  # inside a line over MAX_LINE: dropped up to its start
        while end > 0:
            start = max(0, end - block)
            fh.seek(start)
            lines = (fh.read(end - start) + pending).split(b"\n")
            end = start
            pending = lines.pop(0) if start > 0 else b""
            if skipping and lines:  # the oversized line's start: dropped
                lines.pop()
                read_skips.skip(path, -end, f"a line over {MAX_LINE:,} bytes")
                skipping, last = False, False
            if len(pending) > MAX_LINE:
                pending, skipping = b"", True
            if last and lines:
                last = False
                row = _row(path, 0, lines.pop(), True)  # kept only when it is complete JSON
                if row is not None:
                    yield row
            for raw in reversed(lines):
                row = _row(path, 0, raw, False)
                if row is not None:
                    yield row
