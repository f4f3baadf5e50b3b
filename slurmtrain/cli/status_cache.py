"""What `cli status` remembers of runs that do not run: last step, validation loss and goodput.

Those three need a run's whole metrics.jsonl (goodput times every step): over a 501-point sweep
that is most of status's time, every time, for figures that change only when the run's files do
(goodput counts up to now only a queued or running run). They are kept per user in `$SLURMTRAIN_STATUS_CACHE` (default
`${XDG_CACHE_HOME:-~/.cache}/slurmtrain/status.json`; `off` keeps nothing), keyed by the run
directory and what they were computed from: the ledger rows status read (count, newest time) and
metrics.jsonl's size and mtime. Both files are only ever appended to, so any new row misses.
A queued or running run is never cached (its goodput grows with the clock). The cache is only
a shortcut: unreadable, or not writable, status computes everything as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

if TYPE_CHECKING:
    from slurmtrain.common.events import Row

CACHE_ENV = "SLURMTRAIN_STATUS_CACHE"
MAX_RUNS = 20_000  # the newest entries kept

Key = list[object]
Figures = tuple[int, Optional[float], Optional[float]]  # step, valid_loss, goodput


def path() -> Optional[Path]:
    where = os.environ.get(CACHE_ENV)
    if where is not None:
        return None if where.strip().lower() in ("", "off", "0", "no") else Path(where)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "slurmtrain" / "status.json"


class Cache:
    def __init__(self) -> None:
        self.file = path()
        self.runs: dict[str, list[object]] = {}
        self.changed = False
        if self.file is None:
            return
        try:
            data = json.loads(self.file.read_text())
        except (OSError, ValueError):
            return
        if isinstance(data, dict) and isinstance(data.get("runs"), dict):
            self.runs = data["runs"]

    @staticmethod
    def key(run: Path, events: Sequence[Row]) -> Optional[Key]:
        """What the figures were computed from: the ledger rows status read (how many, the
        newest's time) and metrics.jsonl's size and mtime."""
        try:
            st = os.stat(run / "metrics.jsonl")
            metrics: list[Optional[int]] = [st.st_size, st.st_mtime_ns]
        except OSError:
            metrics = [None, None]
        return [len(events), events[-1].time if events else None, *metrics]

    def get(self, run: Path, key: Key) -> Optional[Figures]:
        entry = self.runs.get(str(run))
        if not isinstance(entry, list) or len(entry) != 2 or entry[0] != key:
            return None
        figures = entry[1]
        if not isinstance(figures, list) or len(figures) != 3 or not isinstance(figures[0], int):
            return None
        return figures[0], _number(figures[1]), _number(figures[2])

    def put(self, run: Path, key: Key, figures: Figures) -> None:
        if self.file is None:
            return
        self.runs.pop(str(run), None)  # re-inserted last: the newest are kept
        self.runs[str(run)] = [key, list(figures)]
        self.changed = True

    def save(self) -> None:
        if self.file is None or not self.changed:
            return
        runs = dict(list(self.runs.items())[-MAX_RUNS:])
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.file.parent, prefix=".status.")
        except OSError:
            return
        try:
            with os.fdopen(fd, "w") as f:  # mkstemp: mode 0600, the user's own
                json.dump({"runs": runs}, f)
            os.replace(tmp, self.file)  # a status beside this one reads the old or the new
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _number(x: object) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None
