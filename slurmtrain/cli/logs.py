"""`python -m slurmtrain.cli.logs RUN_DIR [--rank R] [--attempt A] [--errors]`: one merged log of a run.

Every rank of every job writes its own files, `logs/<job>_<rank>.out|err` (srun's `%j_%t`, and local
tasks alike; other names such as submitit's `<job>_<task>_log.out` are read too). Reading them one by one hides the
question that matters after a crash: which rank failed first. This merges them, tags each line
`[a{attempt} r{rank}]`, orders by attempt then by each line's timestamp (untimed lines keep their
place after the previous timed line of their file) and ends with the first error: the earliest Python
traceback that is not an NCCL/watchdog echo of some other rank's failure. Streams: memory stays flat.
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from slurmtrain.common.rundir import RunDir

LOG_GLOBS = ("**/*.log", "**/*.out", "**/*.err")
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
    key: tuple  # merge-order key of its first line: earlier key = earlier error
    path: Path
    lineno: int
    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def nccl(self) -> bool:
        return bool(NCCL.search(self.text))


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


def describe(path: Path) -> LogFile:
    """Attempt, rank and job id from a log file's name."""
    name = path.name
    m = _SUBMITIT.match(name) or _SRUN.match(name)
    if m:
        return LogFile(path, None, int(m.group(2)), m.group(1))
    m = _BATCH.match(name)
    if m:
        return LogFile(path, None, None, m.group(1))
    a, r, j = _ATTEMPT.search(name), _RANK.search(name), _JOB.search(name)
    return LogFile(
        path,
        int(a.group(1)) if a else None,
        int(r.group(1)) if r else None,
        j.group(1) if j and not a else None,
    )


def find_logs(run_dir: Path) -> list[LogFile]:
    logs = RunDir(run_dir).logs
    paths = {p for g in LOG_GLOBS for p in logs.glob(g) if p.is_file()}
    files = [describe(p) for p in paths]
    return sorted(
        files, key=lambda f: (f.attempt or 0, -1 if f.rank is None else f.rank, str(f.path))
    )


def attempt_windows(ledger: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Per job id, its attempts and the time up to which a log line belongs to each: the middle of the
    queue gap before the next attempt (a requeued Slurm job keeps its id and appends to its files)."""
    spans: dict[int, list] = {}
    for e in ledger:
        n, t = e.get("attempt"), e.get("time")
        if (
            e.get("event") == "submitted"
            or not isinstance(n, int)
            or not isinstance(t, (int, float))
        ):
            continue
        s = spans.setdefault(n, [None, math.inf, -math.inf])
        s[0] = s[0] or (str(e["job_id"]) if e.get("job_id") is not None else None)
        s[1] = t if e.get("event") == "started" else min(s[1], t)
        s[2] = max(s[2], t)
    by_job: dict[str, list[tuple[int, float, float]]] = {}
    for n, (job, begin, end) in sorted(spans.items()):
        if job is not None:
            by_job.setdefault(job, []).append((n, begin, end))
    out = {}
    for job, rows in by_job.items():
        out[job] = [
            (n, (end + rows[i + 1][1]) / 2 if i + 1 < len(rows) else math.inf)
            for i, (n, _, end) in enumerate(rows)
        ]
    return out


class _TracebackTracker:
    """Cuts one file's lines into tracebacks (chained ones stay one block)."""

    def __init__(self, done: Callable[[Traceback], None]) -> None:
        self.done, self.cur, self.state = done, None, "none"  # none | tb | after | chain

    def feed(self, text: str, make: Callable[[], Traceback]) -> bool:
        body = _SRUN_PREFIX.sub("", text, count=1)
        if self.state == "tb":
            self.cur.lines.append(text)
            if body.strip() and not body[0].isspace() and TB_START not in body:
                self.state = "after"  # the exception line closes the block
            return True
        if self.state in ("after", "chain"):
            if not body.strip():
                return False
            if body.startswith(CHAIN):
                self.cur.lines += ["", text]
                self.state = "chain"
                return True
            if self.state == "chain" and TB_START in body:
                self.cur.lines.append(text)
                self.state = "tb"
                return True
            self.close()
        if TB_START in body:
            self.cur, self.state = make(), "tb"
            self.cur.lines.append(text)
            return True
        return False

    def close(self) -> None:
        if self.cur is not None:
            self.done(self.cur)
        self.cur, self.state = None, "none"


class LogMerger:
    """Iterate the merged lines; afterwards `tracebacks` holds every block and `first_error()` the answer."""

    def __init__(
        self, run_dir: Path | str, rank: Optional[int] = None, attempt: Optional[int] = None
    ) -> None:
        self.run_dir = Path(run_dir)
        self.files = [f for f in find_logs(self.run_dir) if rank is None or f.rank == rank]
        self.attempt = attempt
        self.windows = attempt_windows(RunDir(self.run_dir).events())
        jobs = sorted(
            {f.job_id for f in self.files if f.job_id and f.attempt is None},
            key=lambda j: tuple(int(x) for x in j.split("_")),
        )
        self.ordinal = {j: i + 1 for i, j in enumerate(jobs)} if not self.windows else {}
        self.tracebacks: list[Traceback] = []
        self.first_error_line: Optional[LogLine] = None

    def _file_lines(self, idx: int, f: LogFile) -> Iterator[tuple[tuple, LogLine]]:
        windows = self.windows.get(f.job_id or "", [])
        attempt = (
            f.attempt
            if f.attempt is not None
            else (windows[0][0] if windows else self.ordinal.get(f.job_id))
        )
        wi, ts_eff = 0, -math.inf
        keep = lambda a: self.attempt is None or a == self.attempt  # noqa: E731
        tracker = _TracebackTracker(
            lambda tb: self.tracebacks.append(tb) if keep(tb.attempt) else None
        )
        with open(f.path, errors="replace") as fh:
            for lineno, raw in enumerate(fh, 1):
                text = raw.rstrip("\r\n")
                ts = parse_timestamp(text)
                if ts is not None:
                    ts_eff = max(ts_eff, ts)  # monotone per file, so heapq.merge stays a true merge
                    while f.attempt is None and wi + 1 < len(windows) and ts_eff > windows[wi][1]:
                        wi += 1
                        attempt = windows[wi][0]
                key = (attempt or 0, ts_eff, idx, lineno)
                make = lambda: Traceback(attempt, f.rank, key, f.path, lineno)  # noqa: B023,E731
                line = LogLine(attempt, f.rank, ts, text, f.path, lineno, tracker.feed(text, make))
                if keep(attempt):
                    yield key, line
        tracker.close()

    def __iter__(self) -> Iterator[LogLine]:
        streams = [self._file_lines(i, f) for i, f in enumerate(self.files)]
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


def _print_first_error(m: LogMerger) -> None:
    """A red rule naming where, then the block unwrapped (copy-pasteable), then a closing rule."""
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False)
    tb = m.first_error()
    if tb is not None:
        tag = LogLine(tb.attempt, tb.rank, None, "", tb.path, tb.lineno).tag
        note = "  (only NCCL/watchdog tracebacks found)" if tb.nccl else ""
        where, text = f"{tag} {tb.path.name}:{tb.lineno}{note}", tb.text
    elif m.first_error_line is not None:
        ln = m.first_error_line
        where, text = f"{ln.tag} {ln.path.name}:{ln.lineno} (no Python traceback)", ln.text
    else:
        console.print(Text("First error: none found", style="green"))
        return
    console.rule(Text(f"First error {where}", style="bold red"), style="red", align="left")
    console.print(Text(text, style="bold red"), soft_wrap=True)
    console.rule(style="red")


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m slurmtrain.cli.logs", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument("--rank", type=int, default=None, help="only this global rank's files")
    p.add_argument("--attempt", type=int, default=None, help="only this attempt")
    p.add_argument("--errors", action="store_true", help="only traceback and error lines")
    args = p.parse_args(argv)
    if not RunDir(args.run_dir).logs.is_dir():
        print(
            f"run_dir={args.run_dir}: no logs/ directory; pass a run directory "
            f"(<runs_root>/<name>/<fingerprint>)",
            file=sys.stderr,
        )
        return 2
    m = LogMerger(args.run_dir, args.rank, args.attempt)
    try:
        for line in m:
            if not args.errors or line.in_traceback or ERROR_LINE.search(line.text):
                sys.stdout.write(f"{line.tag} {line.text}\n")
        sys.stdout.flush()
        _print_first_error(m)
    except BrokenPipeError:  # `| head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
