"""The ledger's writing and reading helpers from before the row classes (common/events.py), kept
while writers and readers move to the classes: kinds as strings (`Kind`), the class-bearing
constructors, and field readers of rows as mappings. Nothing new uses them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Iterable, NamedTuple, Optional, Protocol, Sequence, TypedDict

from slurmtrain.common.row_codec import Row


class Kind(StrEnum):
    """Every event a run's ledger holds (old run directories included)."""

    submitted = "submitted"
    branched = "branched"
    started = "started"
    attempt_ended = "attempt_ended"
    stopped = "stopped"
    finished = "finished"
    paused = "paused"
    failed = "failed"
    signal = "signal"
    requeued = "requeued"
    resubmitting = "resubmitting"
    release_failed = "release_failed"
    restarted_in_allocation = "restarted_in_allocation"
    relaunch_abandoned = "relaunch_abandoned"
    supervisor_failed = "supervisor_failed"
    budget_window = "budget_window"
    cancelled = "cancelled"
    duplicate_refused = "duplicate_refused"
    node_lost = "node_lost"
    bad_node = "bad_node"
    health_ok = "health_ok"
    rendezvous_done = "rendezvous_done"
    startup = "startup"
    deadlines = "deadlines"
    rollback = "rollback"
    resume_applied = "resume_applied"
    checkpoint_saved = "checkpoint_saved"
    checkpoint_failed = "checkpoint_failed"
    checkpoint_loaded = "checkpoint_loaded"
    checkpoint_skipped = "checkpoint_skipped"
    checkpoint_verified = "checkpoint_verified"
    checkpoint_converted = "checkpoint_converted"
    checkpoint_unloadable = "checkpoint_unloadable"
    straggler = "straggler"
    memory_checked = "memory_checked"
    flops_profile = "flops_profile"
    tracker_failed = "tracker_failed"


class Where(TypedDict, total=False):
    """Which start (and rank) wrote a row: writers pass it to `record` as keywords."""

    job_id: Optional[str]
    attempt: Optional[int]
    nodes: list[str]
    restart: int
    relaunch: Optional[int]
    rank: int
    node: Optional[str]


class Event(NamedTuple):
    """An event to record: its kind and the fields its constructor fixes. `cls` arguments take a
    FailureClass, or a class string read back from a rank's row (kept as written)."""

    kind: Kind
    fields: dict[str, object]


class Recorder(Protocol):
    """What writes and reads a run's ledger (common/rundir.py's RunDir)."""

    def record(
        self,
        event: str | Event | Row,
        *,
        job_id: Optional[str] = None,
        attempt: Optional[int] = None,
        nodes: Iterable[str] = (),
        durable: Optional[bool] = None,
        **fields: object,
    ) -> Row: ...

    def run_events(self, kind: Optional[str] = None) -> Sequence[Row]: ...


def attempt_ended(cls: str, **fields: object) -> Event:
    return Event(Kind.attempt_ended, {"class": str(cls), **fields})


def stopped(cls: str, error: str, **fields: object) -> Event:
    return Event(Kind.stopped, {"class": str(cls), "error": error, **fields})


def failed(cls: str, error: str, **fields: object) -> Event:
    return Event(Kind.failed, {"class": str(cls), "error": error, **fields})


def relaunch_abandoned(cls: str, reason: str) -> Event:
    return Event(Kind.relaunch_abandoned, {"class": str(cls), "reason": reason})


def requeued(
    reason: str,
    new_job_id: str,
    how: str,
    *,
    excluded: Optional[list[str]] = None,
    exclusions_dropped: Optional[list[str]] = None,
    at: Optional[str] = None,
) -> Event:
    """The run's next job exists: `how` requeue (same id) or resubmit; `at` names the time
    limit or preemption that made a restart outside the supervisor's normal path."""
    fields: dict[str, object] = {"reason": str(reason)}
    if excluded is not None:
        fields["excluded"] = excluded
    if exclusions_dropped is not None:
        fields["exclusions_dropped"] = exclusions_dropped
    fields.update(new_job_id=new_job_id, how=how)
    if at is not None:
        fields["at"] = at
    return Event(Kind.requeued, fields)


def text(row: Row, key: str) -> Optional[str]:
    """A field as a string (None when absent or null)."""
    value = row.get(key)
    return None if value is None else str(value)


def number(row: Row, key: str, default: float = 0.0) -> float:
    """A numeric field (`default` when absent, null or not a number)."""
    value = row.get(key)
    if isinstance(value, (int, float, str)):
        try:
            return float(value)
        except ValueError:
            return default
    return default


def integer(row: Row, key: str) -> Optional[int]:
    """An integer field (None when absent, null or not an integer)."""
    value = row.get(key)
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return int(value)
        except (ValueError, OverflowError):
            return None
    return None


def strings(row: Row, key: str) -> list[str]:
    """A list field as strings (empty when absent)."""
    value = row.get(key)
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []
