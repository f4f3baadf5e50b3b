"""The merge behind `cli logs`: name the log files, cut appended job files into attempts, merge.

Every rank of every job writes its own files, `logs/<job>_<rank>.out|err` (srun's `%j_%t`, and local
tasks alike; other names such as submitit's `<job>_<task>_log.out` are read too). A requeued job keeps
its id, and srun's `--open-mode=append` appends each requeue to the same files: the ledger's attempt
windows cut them by time. Lines are ordered by attempt then by each line's timestamp (untimed lines keep
their place after the previous timed line of their file); the first error is the earliest Python
traceback that is not an NCCL/watchdog echo of some other rank's failure. At 4,096 ranks x 100 attempts
this holds one file open at a time and reads only the files of the attempts and ranks shown.
"""

from __future__ import annotations

import heapq
import math
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from slurmtrain.common import events, read_skips
from slurmtrain.common.events import Row
from slurmtrain.common.jsonl_lines import why
from slurmtrain.common.rundir import RunDir

MergeKey = tuple[int, float, int, int]  # (attempt, timestamp, file index, line number)

LOG_SUFFIXES = (".log", ".out", ".err")
BIG_RUN = 64  # more log files than this: the newest attempt alone, unless asked for more
_SUBMITIT = re.compile(r"^(\d+(?:_\d+)?)_(\d+)_log\.(?:out|err)$")
_SRUN = re.compile(r"^(\d+(?:_\d+)?)_(\d+)\.(?:out|err)$")  # job.sbatch's srun --output=%j_%t
_BATCH = re.compile(r"^(\d+(?:_\d+)?)\.batch\.out$")  # job.sbatch's own output: the job, no rank
_ATTEMPT = re.compile(r"attempt[_-]?(\d+)")
_RANK = re.compile(r"rank[_-]?(\d+)")
_JOB = re.compile(r"(?:^|slurm-)(\d+(?:_\d+)?)(?=[._])")
_TS = re.compile(
    r"(?:\d+: |\[rank\d+\]:\s?|submitit \w+ \(|\[)?"
    r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:[.,](\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?"
)
_SRUN_PREFIX = re.compile(
    r"^(?:\d+: |\[rank\d+\]:\s?)"
)  # `srun -l`, torchrun: stripped before parsing
TB_START = "Traceback (most recent call last):"
CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
NCCL = re.compile(r"NCCL|ProcessGroupNCCL|watchdog", re.IGNORECASE)
ERROR_LINE = re.compile(
    r"Traceback|\b(?:ERROR|CRITICAL|FATAL)\b|\w+(?:Error|Exception):|\berror:|"
    r"Segmentation fault|\bKilled\b|oom[-_]kill|Out of memory",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class LogFile:
    path: Path
    attempt: Optional[int]  # from the name; None: from timestamps and the ledger
    rank: Optional[int]
    job_id: Optional[str]


@dataclass(frozen=True)
class LogLine:
    attempt: Optional[int]
    rank: Optional[int]
    ts: Optional[float]  # this line's own timestamp, if it starts with one
    text: str
    path: Path
    lineno: int
    in_traceback: bool = False

    @property
    def tag(self) -> str:
        return f"[a{'?' if self.attempt is None else self.attempt} r{'?' if self.rank is None else self.rank}]"


@dataclass
class Traceback:
    attempt: Optional[int]
    rank: Optional[int]
    key: MergeKey  # of its first line: earlier key = earlier error
    path: Path
    lineno: int
    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def nccl(self) -> bool:
        """NCCL's or its watchdog's error, judged on the block's own lines (the header, the
        exception and its message): a RuntimeError raised in a frame of compute/faults/watchdog.py,
        or under a `watchdog` code line, is not NCCL's."""
        bodies = (_SRUN_PREFIX.sub("", ln, count=1) for ln in self.lines)
        return any(NCCL.search(b) for b in bodies if b.strip() and not b[0].isspace())


def parse_timestamp(line: str) -> Optional[float]:
    """Unix time of a leading ISO-8601 / `%Y-%m-%d %H:%M:%S[,ms]` stamp; naive stamps are local time."""
    m = _TS.match(line)
    if not m:
        return None
    date, hms, frac, tz = m.groups()
    text = f"{date}T{hms}" + (f".{frac[:6].ljust(6, '0')}" if frac else "")
    if tz:
        text += "+00:00" if tz == "Z" else (tz if ":" in tz else f"{tz[:3]}:{tz[3:]}")
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def name_parts(name: str) -> tuple[Optional[int], Optional[int], Optional[str]]:
    """Attempt, rank and job id from a log file's name."""
    m = _SUBMITIT.match(name) or _SRUN.match(name)
    if m:
        return None, int(m.group(2)), m.group(1)
    m = _BATCH.match(name)
    if m:
        return None, None, m.group(1)
    a, r, j = _ATTEMPT.search(name), _RANK.search(name), _JOB.search(name)
    return (
        int(a.group(1)) if a else None,
        int(r.group(1)) if r else None,
        j.group(1) if j and not a else None,
    )


def describe(path: Path) -> LogFile:
    """Attempt, rank and job id from a log file's name."""
    return LogFile(path, *name_parts(path.name))


def _scan(logs_dir: Path) -> Iterator[tuple[str, str]]:
    """(path, name) of every log file under `logs_dir`, nothing opened: os.scandir, one directory
    (one descriptor) at a time, so 100,000 rank logs cost one listing, not three globs."""
    dirs = [os.fspath(logs_dir)]
    while dirs:
        try:
            with os.scandir(dirs.pop()) as entries:
                for e in entries:
                    if e.is_dir(follow_symlinks=False):
                        dirs.append(e.path)
                    elif e.name.endswith(LOG_SUFFIXES) and e.is_file():
                        yield e.path, e.name
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue


def scan_logs(logs_dir: Path) -> list[LogFile]:
    """Every log file under `logs_dir`, described by its name alone, in merge order."""
    return sorted((describe(Path(p)) for p, _ in _scan(logs_dir)), key=_file_order)


def _file_order(f: LogFile) -> tuple[int, int, str]:
    return (f.attempt or 0, -1 if f.rank is None else f.rank, str(f.path))


def find_logs(run_dir: Path) -> list[LogFile]:
    return scan_logs(RunDir(Path(run_dir)).logs)


def attempt_windows(ledger: Iterable[Row]) -> dict[str, list[tuple[int, float]]]:
    """Per job id, its attempts and the time up to which a log line belongs to each: the middle of the
    queue gap before the next attempt (a requeued Slurm job keeps its id and appends to its files)."""
    spans: dict[int, tuple[Optional[str], float, float]] = {}  # attempt -> (job, begin, end)
    for e in ledger:
        n, t = e.attempt, e.time
        if isinstance(e, events.Submitted) or n is None:
            continue
        job, begin, end = spans.get(n, (None, math.inf, -math.inf))
        job = job or e.job_id
        begin = t if isinstance(e, events.Started) else min(begin, t)
        spans[n] = (job, begin, max(end, t))
    by_job: dict[str, list[tuple[int, float, float]]] = {}
    for n, (job, begin, end) in sorted(spans.items()):
        if job is not None:
            by_job.setdefault(job, []).append((n, begin, end))
    out: dict[str, list[tuple[int, float]]] = {}
    for job, rows in by_job.items():
        out[job] = [
            (n, (end + rows[i + 1][1]) / 2 if i + 1 < len(rows) else math.inf)
            for i, (n, _, end) in enumerate(rows)
        ]
    return out


class _TracebackTracker:
    """Cuts one file's lines into tracebacks (chained ones stay one block)."""

    def __init__(self, done: Callable[[Traceback], None]) -> None:
        self.done = done
        self.cur: Optional[Traceback] = None
        self.state = "none"  # none | tb | after | chain

    def _open(self) -> Traceback:
        assert self.cur is not None, "a block is open in every state but none"
        return self.cur

    def feed(self, text: str, make: Callable[[], Traceback]) -> bool:
        body = _SRUN_PREFIX.sub("", text, count=1)
        if self.state == "tb":
            self._open().lines.append(text)
            if body.strip() and not body[0].isspace() and TB_START not in body:
                self.state = "after"  # the exception line closes the block
            return True
        if self.state in ("after", "chain"):
            if not body.strip():
                return False
            if body.startswith(CHAIN):
                self._open().lines += ["", text]
                self.state = "chain"
                return True
            if self.state == "chain" and TB_START in body:
                self._open().lines.append(text)
                self.state = "tb"
                return True
            self.close()
        if TB_START in body:
            self.cur, self.state = make(), "tb"
            self._open().lines.append(text)
            return True
        return False

    def close(self) -> None:
        if self.cur is not None:
            self.done(self.cur)
        self.cur, self.state = None, "none"


class LogMerger:
    """Iterate the merged lines; afterwards `tracebacks` holds every block and `first_error()` the answer.

    Bounded at any scale: files are picked by name before any is opened (`rank`, `attempt`; a run of
    more than BIG_RUN files shows its newest attempt unless `all_attempts`), then read one at a time,
    so one file is open at once. Lines are merged in memory a segment at a time (files whose
    attempts overlap: in practice one job and its requeues), so memory holds one segment's shown
    lines, never the whole run's."""

    def __init__(
        self,
        run_dir: Path | str,
        rank: Optional[int] = None,
        attempt: Optional[int] = None,
        all_attempts: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir)
        run = RunDir(self.run_dir)
        # Only the run tier (started/attempt_ended...) is needed: rows without per-rank failures.
        self.windows = attempt_windows(run.run_events())
        self.by_job = {job: tuple(n for n, _ in w) for job, w in self.windows.items()}
        # By name alone (nothing opened yet): (path, attempt, rank, job id).
        every = [(p, *name_parts(name)) for p, name in _scan(run.logs)]
        jobs = sorted(
            {j for _, a, _, j in every if j and a is None},
            key=lambda j: tuple(int(x) for x in j.split("_")),
        )
        self.ordinal = {j: i + 1 for i, j in enumerate(jobs)} if not self.windows else {}
        files = [f for f in every if rank is None or f[2] == rank]
        self.note: Optional[str] = None  # set when the newest attempt alone is shown
        if attempt is None and not all_attempts and len(files) > BIG_RUN:
            named = {(a, j) for _, a, _, j in files}
            known = sorted({n for a, j in named for n in self._attempts(a, j) if n is not None})
            if known:
                attempt = known[-1]
                shown = sum(attempt in self._attempts(a, j) for _, a, _, j in files)
                self.note = (
                    f"Showing attempt {attempt} of {known[0]}-{known[-1]} only ({shown:,} of "
                    f"{len(files):,} log files): --attempt N for another, --all for every attempt"
                )
        self.attempt = attempt
        self.files = sorted(
            (
                LogFile(Path(p), a, r, j)
                for p, a, r, j in files
                if attempt is None or attempt in self._attempts(a, j)
            ),
            key=_file_order,
        )
        self.tracebacks: list[Traceback] = []
        self.first_error_line: Optional[LogLine] = None

    def _attempts(self, attempt: Optional[int], job: Optional[str]) -> tuple[Optional[int], ...]:
        """The attempts a file may hold: its name's, else its job's from the ledger, else the
        job's rank among the run's job ids (no ledger), else unknown (None)."""
        if attempt is not None:
            return (attempt,)
        return self.by_job.get(job or "") or (self.ordinal.get(job or ""),)

    def _keep(self, attempt: Optional[int]) -> bool:
        return self.attempt is None or attempt == self.attempt

    def _file_lines(self, idx: int, f: LogFile) -> list[tuple[MergeKey, LogLine]]:
        """The shown lines of one file, read start to end and closed before the next is opened.
        An appended job file is cut into attempts by time (attempt_windows)."""
        windows = [] if f.attempt is not None else self.windows.get(f.job_id or "", [])
        attempt = self._attempts(f.attempt, f.job_id)[0]
        wi, ts_eff, out = 0, -math.inf, []
        tracker = _TracebackTracker(
            lambda tb: self.tracebacks.append(tb) if self._keep(tb.attempt) else None
        )
        try:
            fh = open(f.path, errors="replace")
        except OSError as err:  # another user's 0600 log: skipped, told in one line (logs.py)
            read_skips.skip(f.path, 0, why(err))
            return []
        with fh:
            for lineno, raw in enumerate(fh, 1):
                text = raw.rstrip("\r\n")
                ts = parse_timestamp(text)
                if ts is not None:
                    ts_eff = max(ts_eff, ts)  # monotone per file, so the merge stays a true merge
                    while wi + 1 < len(windows) and ts_eff > windows[wi][1]:
                        wi += 1
                        attempt = windows[wi][0]
                if not self._keep(attempt):
                    if self.attempt is not None and attempt is not None and attempt > self.attempt:
                        break  # attempts only grow down a file: the rest is later attempts
                    continue
                key = (attempt or 0, ts_eff, idx, lineno)
                make = lambda: Traceback(attempt, f.rank, key, f.path, lineno)  # noqa: B023,E731
                in_tb = tracker.feed(text, make)
                out.append((key, LogLine(attempt, f.rank, ts, text, f.path, lineno, in_tb)))
        tracker.close()
        return out

    def _segments(self) -> Iterator[list[tuple[int, LogFile]]]:
        """The files in groups whose attempt ranges do not overlap, in attempt order: every line
        of one group sorts before every line of the next, so each group is merged on its own."""
        spans = []
        for idx, f in enumerate(self.files):
            attempts = [a or 0 for a in self._attempts(f.attempt, f.job_id) if self._keep(a)] or [0]
            spans.append((min(attempts), max(attempts), idx, f))
        spans.sort(key=lambda s: (s[0], s[2]))
        group: list[tuple[int, LogFile]] = []
        top = -math.inf
        for lo, hi, idx, f in spans:
            if group and lo > top:
                yield group
                group, top = [], -math.inf
            group.append((idx, f))
            top = max(top, hi)
        if group:
            yield group

    def __iter__(self) -> Iterator[LogLine]:
        for group in self._segments():
            streams = [self._file_lines(idx, f) for idx, f in group]
            for _, line in heapq.merge(*streams, key=lambda kv: kv[0]):
                if (
                    self.first_error_line is None
                    and ERROR_LINE.search(line.text)
                    and not NCCL.search(line.text)
                ):
                    self.first_error_line = line
                yield line

    def first_error(self) -> Optional[Traceback]:
        """The earliest non-NCCL traceback; the earliest NCCL one if that is all there is."""
        ordered = sorted(self.tracebacks, key=lambda tb: tb.key)
        return next((tb for tb in ordered if not tb.nccl), ordered[0] if ordered else None)
