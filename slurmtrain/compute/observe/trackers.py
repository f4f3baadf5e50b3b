"""Experiment trackers (W&B, MLflow, Aim: common/tracker_registry.py) that see one run however
many jobs train it.

Rank 0 mirrors what MetricsWriter logs (metrics.jsonl stays the record) to the trackers `logger=`
chose; every attempt continues ONE tracker run, found by the run's fingerprint. A tracker's step
axis must only grow, so StepAxis passes each step once, past the highest step any attempt logged.
The ledger's events go along as counters and rows. A failing tracker never stops training: at open,
write or close, it is reported once (a warning on stderr, a `tracker_failed` row) and dropped;
TensorBoard (MetricsWriter's own) the same way.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable, Optional

from slurmtrain.common import events, secrets, tracker_registry
from slurmtrain.common.events import Row, Rows
from slurmtrain.common.schema import RootConfig
from slurmtrain.compute.observe import tracker_backends
from slurmtrain.compute.observe.tracker_backends import Backend, failure_class

TRACKER_KINDS = tracker_registry.names()  # besides TensorBoard (MetricsWriter's own)

TAIL_BYTES = 1 << 20  # metrics.jsonl's tail read for the highest logged step: O(1), not O(steps)


def tracker_run_id(name: str, fingerprint: str) -> str:
    """One tracker run per slurmtrain run: `<name>-<fingerprint>` (W&B ids: <= 64 characters,
    none of / \\ # ? % :; run names are [A-Za-z0-9._-] already)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return f"{safe[: 63 - len(fingerprint)]}-{fingerprint}"


def last_logged_step(metrics: Path) -> int:
    """The highest step in metrics.jsonl's last TAIL_BYTES (0: none): what trackers have seen."""
    try:
        with open(metrics, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read()
    except FileNotFoundError:
        return 0
    lines = tail.split(b"\n")
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first line may be cut
    best = 0
    for line in lines:
        try:
            best = max(best, int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line (a killed writer), or not a row
    return best


class StepAxis:
    """Passes each step once and in increasing order: `accept(step)` is True for a step past
    every step accepted before (this attempt's and, through `last`, earlier attempts')."""

    def __init__(self, last: int = 0) -> None:
        self.last = last

    def accept(self, step: int) -> bool:
        if step <= self.last:
            return False
        self.last = step
        return True


def event_counts(rows: Rows) -> dict[str, float]:
    """Counters for a metrics row: `event/<name>` and, for a row with a failure class,
    `failure_class/<class>` = how many (never a key below another: MLflow's file store makes
    each key a file, so `event/failed` and `event/failed/crash` cannot both exist)."""
    out: dict[str, float] = {}
    for row in rows:
        keys = [f"event/{row.event}"]
        cls = failure_class(row)
        if cls:
            keys.append(f"failure_class/{cls}")
        for key in keys:
            out[key] = out.get(key, 0.0) + 1.0
    return out


def _chosen(cfg: RootConfig, kind: str) -> bool:
    """Whether `logger=` chose `kind` (its section is set; a config.yaml from before `logger` has
    no such section)."""
    return getattr(cfg.logger, kind, None) is not None


def wanted(cfg: RootConfig) -> list[str]:
    """The trackers `logger=` chose, besides TensorBoard (MetricsWriter's own)."""
    return [kind for kind in TRACKER_KINDS if _chosen(cfg, kind)]


def tensorboard_on(cfg: RootConfig) -> bool:
    """TensorBoard is on when chosen, and when no tracker is (configs from before `logger`)."""
    kinds = ("tensorboard", *TRACKER_KINDS)
    return _chosen(cfg, "tensorboard") or not any(_chosen(cfg, k) for k in kinds)


class Trackers:
    """Rank 0's trackers for one attempt: metrics rows on a monotonic step axis, ledger events."""

    def __init__(
        self,
        tracker_backends: list[Backend],
        axis: StepAxis,
        rows: Rows,
        attempt: int,
        record: Optional[Callable[[Row], object]] = None,
    ) -> None:
        self.backends, self.axis, self.rows, self.attempt = tracker_backends, axis, rows, attempt
        self.record = record
        # The rows of the attempt before that close it (`closing`: written by the supervisor or the
        # next start, so this tracker reports them) and this attempt's `tracked` rows so far.
        self.pending = [
            r
            for r in rows
            if (r.attempt == attempt - 1 and type(r).closing)
            or (r.attempt == attempt and type(r).tracked)
        ]
        self.seen = len(rows)
        self.kept: Rows = []  # this attempt's rows, saved with the tracker run (event_row)

    def _new_events(self) -> Rows:
        fresh = [r for r in self.rows[self.seen :] if type(r).tracked]
        self.seen = len(self.rows)
        out, self.pending = [*self.pending, *fresh], []
        return out

    def log(self, step: int, values: dict[str, float]) -> None:
        if not self.backends or not self.axis.accept(step):
            return  # a step logged before (rollback, resume): its events wait for a new step
        fresh = self._new_events()
        self.kept += fresh
        self._each("log", step, {**values, **event_counts(fresh)}, fresh)

    def close(self) -> None:
        fresh = self._new_events()
        self.kept += fresh
        self._each("close", self.axis.last, self.kept, fresh)

    def _each(self, method: str, *args: object) -> None:
        phase = PHASES[method]
        for backend in list(self.backends):
            # A tracker never stops training (metrics.jsonl has every row); SystemExit too (a
            # package's own exit), not Ctrl-C or a signal's exception: those are the attempt's.
            try:
                getattr(backend, method)(*args)
            except (Exception, SystemExit) as err:
                self.drop(backend, phase, err)

    def drop(self, backend: Backend, phase: str, err: BaseException) -> None:
        self.backends.remove(backend)
        report_failure(backend.kind, phase, err, self.record)


PHASES = {"log": "write", "close": "close"}  # Trackers' calls -> TrackerFailed.phase
ERROR_CHARS = 500  # TrackerFailed.error: the type and the message's start; the log has the rest


def report_failure(
    kind: str, phase: str, err: BaseException, record: Optional[Callable[[Row], object]]
) -> None:
    """A tracker that failed (`phase`: open, write or close) and is dropped: one warning line
    (stderr: the job's log) and a durable `tracker_failed` row; training goes on."""
    error = secrets.redact_text(f"{type(err).__name__}: {err}")
    error = " ".join(error.split())[:ERROR_CHARS]
    print(
        f"slurmtrain: warning: tracker {kind} failed at {phase} and is dropped (training goes "
        f"on; metrics.jsonl has every row): {error}",
        file=sys.stderr,
        flush=True,
    )
    if record is None:
        return
    try:
        record(events.TrackerFailed(tracker=kind, phase=phase, error=error))
    except Exception as failed:  # noqa: BLE001  a full disk: not the tracker's failure to raise
        print(f"slurmtrain: warning: tracker_failed not recorded: {failed}", file=sys.stderr)


def open_trackers(
    cfg: RootConfig,
    run_path: Path,
    metrics: Path,
    attempt: int,
    rows: Rows,
    record: Optional[Callable[[Row], object]] = None,
) -> Optional[Trackers]:
    """Rank 0: the trackers `logger=` chose, each resuming the run's one tracker run (None:
    none chosen)."""
    if not wanted(cfg):
        return None
    run_path = Path(run_path)
    axis = StepAxis(last_logged_step(metrics))
    out = Trackers([], axis, rows, attempt, record)
    context = tracker_backends.RunContext(
        cfg=cfg,
        path=run_path,
        run_id=tracker_run_id(run_path.parent.name, run_path.name),
        fingerprint=run_path.name,
        attempt=attempt,
        rows=rows,
    )
    for kind in wanted(cfg):
        try:
            out.backends.append(tracker_backends.OPENERS[kind](context))
        except (Exception, SystemExit) as err:  # as in Trackers._each
            report_failure(kind, "open", err, record)
    return out
