"""How an async save's ranks tell rank 0 they are done: one marker file per host, not per rank.

Each rank's background writer, once its shards are fsynced, appends its report as one JSON line to
its host's marker `step_N.tmp/.done_rank{L}.json` (L: the host's lowest rank, `distributed.host_leads`).
One O_APPEND `write(2)` of a whole line is whole for every process of one host, and a line starts
with a newline, so a line cut short (full disk) never spoils the next. Rank 0 re-reads only the
markers of hosts it still waits for: O(hosts) reads per poll, not O(ranks).

A marker is a message, not state: the shards were fsynced before it, and an abandoned save's
`step_N.tmp/` is removed later, so markers are not fsynced. The names match checkpoint_format's
MARKER (never in a manifest, removed by `seal`). A rank that cannot append touches
`.step_N.tmp.failed_rank{r}` beside the directory (`prune` removes it); a silent rank is reported
failed when rank 0's wait runs out.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import NotRequired, Optional, TypedDict, cast


class FileEntry(TypedDict):
    """A written file as the manifest lists it."""

    size: int
    crc32: NotRequired[str]  # checkpoint_format.CHECKSUM, with verify=checksum


class RankReport(TypedDict):
    """One rank's outcome of a save (ShardWriter.report, or a failure rank 0 made up)."""

    rank: int
    ok: bool
    error: Optional[str]
    files: dict[str, FileEntry]  # path relative to step_N.tmp/ -> entry
    seconds: NotRequired[dict[str, float]]  # where the save's time went (writer.py)


def marker(tmp: Path, lead: int, kind: str = "done") -> Path:
    return tmp / f".{kind}_rank{lead}.json"


def fallback(tmp: Path, rank: int) -> Path:
    """Next to `step_N.tmp/`, for a rank that could not write into it (pruned later)."""
    return tmp.parent / f".{tmp.name}.failed_rank{rank}"


def write(tmp: Path, report: RankReport, lead: Optional[int] = None) -> None:
    """Append `report` as one line to the marker of host `lead` (default: the rank's own)."""
    line = ("\n" + json.dumps(report) + "\n").encode()
    path = marker(tmp, report["rank"] if lead is None else lead)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.write(fd, line) == len(line):
                return
        finally:
            os.close(fd)
    except OSError:
        pass
    try:  # a line cut short is ignored by readers: say it failed in a name
        fallback(tmp, report["rank"]).touch()
    except OSError:
        pass  # at worst rank 0 times out on this rank; nothing half-written is published


def lines(path: Path) -> list[RankReport]:
    """The whole lines of a marker (one read); a torn or half-written line is skipped."""
    try:
        text = path.read_text()
    except OSError:
        return []
    out: list[RankReport] = []
    for line in text.split("\n")[:-1]:  # the part after the last newline may be in progress
        try:
            report: object = json.loads(line) if line else None
        except json.JSONDecodeError:
            continue
        if isinstance(report, dict) and "rank" in report:  # a whole line `write` made
            out.append(cast(RankReport, report))
    return out


def failed_here(rank: int, error: str) -> RankReport:
    return {"rank": rank, "ok": False, "files": {}, "error": error}


def read(tmp: Path, rank: int, lead: Optional[int] = None) -> Optional[RankReport]:
    """One rank's report, or None while it has not written one."""
    for report in lines(marker(tmp, rank if lead is None else lead)):
        if report["rank"] == rank:
            return report
    if fallback(tmp, rank).exists():
        return failed_here(rank, "could not write into the directory")
    return None


def collect(tmp: Path, leads: list[int], timeout_s: float) -> list[RankReport]:
    """Rank 0: the reports of ranks 1..W-1 (`leads[r]`: rank r's host's lowest rank), a failure
    for any rank silent after `timeout_s`. Each poll reads only the hosts still owing lines."""
    waiting: dict[int, set[int]] = {}
    for r in range(1, len(leads)):
        waiting.setdefault(leads[r], set()).add(r)
    got: dict[int, RankReport] = {}
    deadline, pause = time.time() + timeout_s, 0.01
    while waiting:
        for lead in sorted(waiting):
            for report in lines(marker(tmp, lead)):
                if report["rank"] in waiting[lead]:
                    got[report["rank"]] = report
                    waiting[lead].discard(report["rank"])
        _fallbacks(tmp, waiting, got)
        waiting = {lead: ranks for lead, ranks in waiting.items() if ranks}
        if not waiting or time.time() >= deadline:
            break
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
    for ranks in waiting.values():
        for r in ranks:
            got[r] = failed_here(r, f"no marker after {timeout_s:.0f} s (rank died or hung?)")
    return [got[r] for r in sorted(got)]


def _fallbacks(tmp: Path, waiting: dict[int, set[int]], got: dict[int, RankReport]) -> None:
    """Ranks that could not append their line: one listing of the root finds them all."""
    prefix = f".{tmp.name}.failed_rank"
    try:
        names = [e.name for e in os.scandir(tmp.parent) if e.name.startswith(prefix)]
    except OSError:
        return
    for name in names:
        tail = name[len(prefix) :]
        r = int(tail) if tail.isdigit() else -1
        for ranks in waiting.values():
            if r in ranks:
                ranks.discard(r)
                got[r] = failed_here(r, "could not write into the directory")
