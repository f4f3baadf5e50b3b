"""Goodput of a run across its whole chain of attempts, from ledger.jsonl and metrics.jsonl.

Login-node code: no torch. Wall time (the first record, normally `submitted`, to the last record, or
to `now` while the run is live) is painted into disjoint parts with a fixed precedence, so the parts
always sum exactly to wall time even when records overlap (a save inside a logged step, a signal in
mid-step, clock skew between nodes). Whatever no rule claims is "other" (eval, data stalls,
teardown, the gap before a resubmission after a failure). The gap between a stop the user asked
for and the user's next submission is "paused by you" : drawn, not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, NamedTuple, Optional

from slurmtrain.cli.goodput_chain import Attempt, chain_of, num, timed, timed_steps
from slurmtrain.common import events
from slurmtrain.common.events import FailureClass, Row, Rows
from slurmtrain.common.jsonl import merge_ledger, merge_rows, rank_keys, rank_tier_files, read_jsonl
from slurmtrain.common.ledger import real_errors
from slurmtrain.common.rundir import RunDir
from slurmtrain.planning.eta import format_duration

# Display order (the labels'); PRECEDENCE decides who owns a second claimed by two rules.
LABELS = {
    "queue_wait": "queue wait",
    "startup": "start-up",
    "checkpoint_load": "ckpt load",
    "productive": "productive",
    "checkpoint_save": "ckpt save",
    "work_lost": "work lost",
    "signal_idle": "idle after signal",
    "other": "other",
    "user_paused": "paused by you",
}
PARTS = tuple(LABELS)
PRECEDENCE: tuple[str, ...] = ("checkpoint_save", "checkpoint_load", "work_lost", "productive")
PRECEDENCE += ("signal_idle", "user_paused", "startup", "queue_wait")


@dataclass(frozen=True)
class Goodput:
    """Seconds per part of the wall time; the parts sum to `wall`. Goodput is productive time over
    `counted` time: wall time less the user's own pauses."""

    wall: float = 0.0
    queue_wait: float = 0.0
    startup: float = 0.0
    checkpoint_load: float = 0.0
    productive: float = 0.0
    checkpoint_save: float = 0.0
    work_lost: float = 0.0
    signal_idle: float = 0.0
    other: float = 0.0
    user_paused: float = 0.0
    start: float = 0.0  # unix time of the first record
    end: float = 0.0  # unix time of the last record (or `now` while live)
    attempts: int = 0
    steps_kept: int = 0
    steps_lost: int = 0
    live: bool = False  # not finished and not stopped by a failure: queued or running

    @property
    def counted(self) -> float:
        """Wall time less the user's pauses: the goodput denominator."""
        return max(self.wall - self.user_paused, 0.0)

    @property
    def goodput(self) -> float:
        return self.productive / self.counted if self.counted > 0 else 0.0

    def parts(self) -> dict[str, float]:
        return {p: getattr(self, p) for p in PARTS}


class Segment(NamedTuple):
    start: float
    end: float
    part: str


_RANK = {p: i for i, p in enumerate(PRECEDENCE)}


class Claims:
    """Intervals of wall time claimed by parts (`paint` gives each instant to one)."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float, int]] = []

    def add(self, s: float, e: float, part: str) -> None:
        if e > s:
            self.spans.append((s, e, _RANK[part]))


def paint(claims: list[tuple[float, float, int]], start: float, end: float) -> list[Segment]:
    """Sweep the claimed intervals; each instant goes to its highest-precedence claimant."""
    points: list[tuple[float, int, int]] = []
    for s, e, p in claims:
        s, e = max(s, start), min(e, end)
        if e > s:
            points += [(s, p, 1), (e, p, -1)]
    points.sort()
    active = [0] * len(PRECEDENCE)
    starts: list[float] = []
    ends: list[float] = []
    parts: list[str] = []
    cur = start
    for t, p, d in [*points, (end, 0, 0)]:
        if t > cur:
            top = "other"
            for i, c in enumerate(active):
                if c:
                    top = PRECEDENCE[i]
                    break
            if parts and parts[-1] == top:
                ends[-1] = t
            else:
                starts.append(cur)
                ends.append(t)
                parts.append(top)
            cur = t
        active[p] += d
    return [Segment(*x) for x in zip(starts, ends, parts)]


@dataclass(frozen=True)
class Analysis:
    goodput: Goodput
    segments: list[Segment]  # disjoint, ordered, covering [start, end]
    lost_records: frozenset[tuple[int, int]] = field(default_factory=frozenset)  # (attempt, step)


def analyze(
    ledger: Iterable[Row], metrics: Iterable[Mapping[str, object]], now: Optional[float] = None
) -> Analysis:
    """Goodput parts and the painted timeline of ledger rows and metrics.jsonl rows. `now` extends
    a live run (queued or running) to now."""
    rows = timed(ledger)
    steps = timed_steps(metrics)
    times = [e.time for e in rows] + [m.time for m in steps]
    if not times:
        return Analysis(Goodput(), [])
    start, end = min(times), max(times)
    submitted = [e.time for e in rows if isinstance(e, events.Submitted)]
    chain = chain_of(rows, steps)
    start = min([start, *(a.begin for a in chain)])
    last = chain[-1] if chain else None
    kinds: set[type[Row]] = last.kinds() if last else set()
    resubmitted = last is not None and any(s > last.end for s in submitted)
    stopped = events.Finished in kinds or (events.Failed in kinds and events.Requeued not in kinds)
    live = (last is None or resubmitted or not stopped) and not _halted(rows, chain)
    if live and now is not None:
        end = max(end, now)
    last_running = last is not None and live and not resubmitted and events.Requeued not in kinds
    if last_running and last is not None:
        last.end = end
    claims = Claims()
    _queue_wait(claims, chain, submitted, None if last_running else end)
    _paused(claims, rows, chain)
    cutoffs = _cutoffs(chain, stopped_failed=not live and events.Failed in kinds)
    kept_n = lost_n = 0
    lost_records: set[tuple[int, int]] = set()
    for a in chain:
        kept, lost = _attempt_claims(claims, a, cutoffs[a.number], lost_records)
        kept_n, lost_n = kept_n + kept, lost_n + lost
    segments = paint(claims.spans, start, end)
    totals = dict.fromkeys(PARTS, 0.0)
    for s in segments:
        totals[s.part] += s.end - s.start
    wall = end - start
    totals["other"] = max(wall - sum(v for p, v in totals.items() if p != "other"), 0.0)
    g = Goodput(
        wall=wall,
        start=start,
        end=end,
        attempts=len(chain),
        steps_kept=kept_n,
        steps_lost=lost_n,
        live=live,
        **totals,
    )
    return Analysis(g, segments, frozenset(lost_records))


def _user_stop(e: Row) -> bool:
    """A stop the user asked for: Ctrl-C or `cli cancel` (the attempt closed `cancelled`, the
    cancel itself), or `train.pause_at_step`."""
    if isinstance(e, (events.AttemptEnded, events.RelaunchAbandoned)):
        return e.cls == FailureClass.cancelled
    return isinstance(e, (events.Cancelled, events.Paused))


def _by_user(a: Attempt) -> bool:
    return any(_user_stop(e) for e in a.rows)


def _halted(rows: Rows, chain: list[Attempt]) -> bool:
    """The user's last stop came after the last submission and the last attempt's start: the run
    is stopped until the user submits it again (not live)."""
    stops = [e.time for e in rows if _user_stop(e)] + [a.end for a in chain if _by_user(a)]
    later = [e.time for e in rows if isinstance(e, events.Submitted)] + [a.begin for a in chain]
    return bool(stops) and max(stops) >= max(later, default=-math.inf)


def _paused(claims: Claims, rows: Rows, chain: list[Attempt]) -> None:
    """The user's pauses: from a stop the user asked for (the end of the attempt it stopped, or
    the stop row itself) to the user's next submission, when that came before the next attempt
    began (a supervisor's requeue is no user's submission)."""
    stops = [a.end for a in chain if _by_user(a)] + [e.time for e in rows if _user_stop(e)]
    subs = [e.time for e in rows if isinstance(e, events.Submitted) and not e.requeue_of]
    for t in stops:
        next_begin = min([a.begin for a in chain if a.begin > t], default=math.inf)
        resumed = [s for s in subs if t < s <= next_begin]
        if resumed:
            claims.add(t, min(resumed), "user_paused")


def _queue_wait(
    claims: Claims, chain: list[Attempt], submitted: list[float], end: Optional[float]
) -> None:
    """Queue wait: submitted -> first start; after each attempt, the gap until the next start (from a
    resubmission inside the gap, if any: before it nobody asked for the run, that is "other").
    `end`: the end of the wall time, when the last attempt no longer runs (None while it does)."""
    prev_end: Optional[float] = None
    gaps: list[tuple[float, Optional[Attempt]]] = [(a.begin, a) for a in chain]
    gaps += [] if end is None else [(end, None)]
    for begin, ended in gaps:
        lo = prev_end if prev_end is not None else -math.inf
        subs = [s for s in submitted if lo <= s <= begin]
        if subs:
            claims.add(min(subs), begin, "queue_wait")
        elif prev_end is not None:
            claims.add(prev_end, begin, "queue_wait")
        if ended is not None:
            prev_end = ended.end


def _cutoffs(chain: list[Attempt], stopped_failed: bool) -> dict[int, float]:
    """Per attempt, the step above which its steps were recomputed by a later attempt (above a
    later attempt's resume point), or never kept (`stopped_failed`: above the last checkpoint)."""
    floor = math.inf
    if stopped_failed:
        saved = [e.step for a in chain for e in a.rows if isinstance(e, events.CheckpointSaved)]
        floor = float(max([s for s in saved if s is not None], default=0))
    cutoffs: dict[int, float] = {}
    for a in reversed(chain):
        cutoffs[a.number] = floor
        r = a.resume_step()
        if r is not None:
            floor = min(floor, r)
    return cutoffs


def _attempt_claims(
    claims: Claims, a: Attempt, cutoff: float, lost_records: set[tuple[int, int]]
) -> tuple[int, int]:
    """One attempt's claims: checkpoint load and save, its steps (productive, or work lost above
    `cutoff`: its records go to `lost_records`), start-up before its first work, idle after a
    signal. Returns (steps kept, steps lost)."""
    kept_n = lost_n = 0
    work_begin = math.inf
    for e in a.rows:
        if isinstance(e, (events.CheckpointLoaded, events.CheckpointSaved)):
            sec = max(num(e.seconds) or 0.0, 0.0)
            load = isinstance(e, events.CheckpointLoaded)
            claims.add(e.time - sec, e.time, "checkpoint_load" if load else "checkpoint_save")
            if load:
                work_begin = min(work_begin, e.time - sec)
    prev_step, prev_t = a.resume_step(), a.begin if a.started is not None else -math.inf
    for m in a.steps:
        step, t = m.step, m.time
        n = max(1, step - prev_step) if prev_step is not None else 1
        st = num(m.row.get("step_time"))
        gap = max(t - prev_t, 0.0)  # a step cannot begin before the attempt or the last step
        span = min(n * max(st, 0.0), gap) if st is not None else gap
        lost = min(max(step - cutoff, 0), n)
        kept_t = t - span + span * (n - lost) / n
        claims.add(t - span, kept_t, "productive")
        claims.add(kept_t, t, "work_lost")
        kept_n, lost_n = kept_n + n - int(lost), lost_n + int(lost)
        if lost:
            lost_records.add((a.number, step))
        work_begin = min(work_begin, t - span)
        prev_step, prev_t = step, t
    if work_begin == math.inf:  # never reached work: the whole attempt was start-up
        work_begin = a.end
    claims.add(a.begin, min(work_begin, a.end), "startup")
    signals = [e.time for e in a.rows if isinstance(e, events.Signal)]
    if signals:
        claims.add(min(signals), a.end, "signal_idle")
    return kept_n, lost_n


def ledger_rows(rd: RunDir) -> Rows:
    """The run tier, and one `failed` row per start in the rank tier (its first real error, else
    its first row): what goodput and report show of failures. An all-rank failure is one
    failure, not 4,096 rows (each rank file is read once, one open at a time)."""
    firsts: Rows = []
    for key in sorted(rank_keys(rd.path)):
        rows = merge_ledger(rank_tier_files(rd.path, key), shared=True)
        failed = [e for e in rows if isinstance(e, events.Failed)]
        if failed:
            firsts.append((real_errors(failed) or failed)[0])
    firsts.sort(key=lambda e: e.time)
    return merge_rows([rd.run_events(), firsts])


def analyze_run(run_dir: Path | str, now: Optional[float] = None) -> Analysis:
    rd = RunDir(Path(run_dir))
    return analyze(ledger_rows(rd), read_jsonl(rd.metrics), now)


def compute_goodput(run_dir: Path | str, now: Optional[float] = None) -> Goodput:
    """Goodput of the run in `run_dir`; pass `now=time.time()` to count a live run up to now."""
    return analyze_run(run_dir, now).goodput


def _paused_note(g: Goodput) -> str:
    return (
        f" (paused by you {format_duration(g.user_paused)} left out)"
        if g.user_paused >= 0.5
        else ""
    )


def format_line(g: Goodput) -> str:
    """One line for `status`: goodput, wall time and the non-zero parts."""
    parts = " · ".join(
        f"{LABELS[p]} {format_duration(v)}" for p, v in g.parts().items() if v >= 0.5
    )
    live = " (live)" if g.live else ""
    return (
        f"goodput {100 * g.goodput:.1f}% of {format_duration(g.wall)} wall{live}{_paused_note(g)}"
        + (f": {parts}" if parts else "")
    )


def format_table(g: Goodput) -> str:
    """Aligned plain-text table: part, duration, seconds, share of wall time."""
    rows = [
        (LABELS[p], format_duration(v), f"{v:.1f}", f"{100 * v / g.wall:.1f}%" if g.wall else "-")
        for p, v in g.parts().items()
        if p != "user_paused" or v > 0
    ]
    rows.append(("wall", format_duration(g.wall), f"{g.wall:.1f}", "100.0%" if g.wall else "-"))
    head = ("part", "time", "seconds", "share")
    w = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]

    def line(r: tuple[str, str, str, str]) -> str:
        return f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]:>{w[3]}}"

    rule = "-" * (sum(w) + 6)
    body = [line(head), rule, *(line(r) for r in rows[:-1]), rule, line(rows[-1])]
    return (
        "\n".join(body) + f"\ngoodput {100 * g.goodput:.1f}%{_paused_note(g)}  "
        f"attempts {g.attempts}  steps kept {g.steps_kept} lost {g.steps_lost}"
        + ("  (live)" if g.live else "")
    )
