"""What readers of run files skipped (unreadable files, odd lines, oversized lines), told in one line.

A reader of a shared runs root must not be stopped by one bad file: another user's unreadable
ledger, a directory named `*.jsonl`, a line that is not a JSON object, a row without `event`, a
64 MiB line. common/jsonl.py skips each and notes it here; the command that read them prints ONE
warning line at its end (`warn`), or, for a process that never calls it (the supervisor), at exit.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Optional

MAX_KEYS = 10_000  # distinct skips remembered (a reader re-reading one bad file counts it once)

_seen: dict[tuple[str, int], str] = {}
_overflow = 0
_told = 0  # skips already in a warning line
_hooked = False


def skip(path: object, where: int, why: str) -> None:
    """Note one skipped line (`where`: its line number; a byte offset or 0 for a whole file)."""
    global _overflow, _hooked
    key = (str(path), where)
    if key in _seen:
        return
    if len(_seen) >= MAX_KEYS:
        _overflow += 1
    else:
        _seen[key] = why
    if not _hooked:  # a process that never calls warn (the supervisor) still says it, once
        _hooked = True
        atexit.register(warn, "slurmtrain")


def count() -> int:
    return len(_seen) + _overflow


def line(prog: str, root: Optional[object] = None) -> Optional[str]:
    """The warning line for what was skipped since the last one (None: nothing new)."""
    n = count()
    if n <= _told:
        return None
    new = list(_seen.items())[min(_told, len(_seen) - 1) :]  # in the order they were met
    (path, where), why = new[0]
    if root is None:
        paths = [p for (p, _), _ in new]
        root = os.path.commonpath(paths) if len(paths) > 1 else os.path.dirname(path)
    first = f"{path}:{where}" if where > 0 else path
    s = "" if n - _told == 1 else "s"
    return (
        f"{prog}: warning: skipped {n - _told} unreadable line{s}/file{s} under {root} "
        f"(first: {first}: {why})"
    )


def warn(prog: str, root: Optional[object] = None) -> None:
    """Print the warning line on stderr, if anything new was skipped."""
    global _told
    text = line(prog, root)
    if text is not None:
        print(text, file=sys.stderr)
        _told = count()


def reset() -> None:
    """Forget every skip (tests)."""
    global _overflow, _told
    _seen.clear()
    _overflow = _told = 0
