"""The ledger's vocabulary: every event kind a run writes, and the failure classes.

A ledger row is one JSON object; what each kind's row carries, and which kinds are
fsynced, is common/event_fields.py. Writers build the class-bearing events with the constructors
below (`attempt_ended`, `stopped`, `failed`, `relaunch_abandoned`, `requeued`) and hand them to
`RunDir.record`; the class is written under the key "class", as it always was.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Iterable, Mapping, NamedTuple, Optional, Protocol, Sequence, TypedDict, TypeVar

from slurmtrain.common.errors import EXIT_BAD_NODE, EXIT_CONFIG, EXIT_HANG, EXIT_REQUEUE


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


class FailureClass(StrEnum):
    """How an attempt ended (`attempt_ended`), or why a run stopped (`stopped`)."""

    preempted = "preempted"
    timed_out = "timed_out"
    node_failure = "node_failure"
    hang = "hang"
    crash = "crash"
    config_error = "config_error"
    oom = "oom"
    diverged = "diverged"
    checkpoint_unreadable = "checkpoint_unreadable"
    cancelled = "cancelled"
    no_nodes = "no_nodes"
    supervisor_error = "supervisor_error"


@dataclass(frozen=True)
class Traits:
    """What a failure class implies."""

    budgeted: bool  # bounded by faults.max_<class> (budget_key); else never counted
    restarts: bool  # the supervisor starts the next attempt (within budget); else the run stops
    # A fresh srun on other nodes of the allocation can cure it. Time limit and preemption end
    # the allocation; an OOM, divergence, unreadable checkpoints or a config error would fail
    # again on any nodes.
    relaunch: bool
    exit_code: Optional[int]  # the step's exit code that means it, if one does
    colour: str  # its marker in cli/report.py


TRAITS: dict[FailureClass, Traits] = {
    # class: Traits(budgeted, restarts, relaunch, exit_code, colour)
    FailureClass.preempted: Traits(True, True, False, None, "#8c564b"),
    FailureClass.timed_out: Traits(True, True, False, EXIT_REQUEUE, "#ff7f0e"),
    FailureClass.node_failure: Traits(True, True, True, EXIT_BAD_NODE, "#d62728"),
    FailureClass.hang: Traits(True, True, True, EXIT_HANG, "#e377c2"),
    FailureClass.crash: Traits(True, True, True, None, "#000000"),
    FailureClass.config_error: Traits(True, False, False, EXIT_CONFIG, "#1f77b4"),
    # A memory plan that does not fit will not heal on other nodes: its own budget.
    FailureClass.oom: Traits(True, True, False, None, "#9467bd"),
    # Recorded by the attempt itself as `stopped`: rollbacks did not cure the loss, or no
    # published checkpoint validates. Budgeted too (max_diverged, max_checkpoint_unreadable).
    FailureClass.diverged: Traits(True, False, False, None, "#bcbd22"),
    FailureClass.checkpoint_unreadable: Traits(True, False, False, None, "#17becf"),
    # The user stopped it: no budget, no restart.
    FailureClass.cancelled: Traits(False, False, False, None, "#c49c94"),
    # Stop classes only: no node set can run the job; neither supervisor nor fallback could go on.
    FailureClass.no_nodes: Traits(False, False, False, None, "#393b79"),
    FailureClass.supervisor_error: Traits(False, False, False, None, "#843c39"),
}

FAILURE_CLASSES: tuple[FailureClass, ...] = tuple(c for c, t in TRAITS.items() if t.budgeted)
RELAUNCH_CLASSES: tuple[FailureClass, ...] = tuple(c for c, t in TRAITS.items() if t.relaunch)
EXIT_CLASS: dict[int, str] = {
    t.exit_code: c.value for c, t in TRAITS.items() if t.exit_code is not None
}


def restarts(cls: str) -> bool:
    """Whether an attempt that ended `cls` is followed by another (a class this version does not
    know, written by a newer one, is restarted: the budgets still bound it)."""
    try:
        return TRAITS[FailureClass(cls)].restarts
    except ValueError:
        return True


def budget_key(cls: FailureClass) -> str:
    """The faults config key bounding `cls` (only for budgeted classes)."""
    return f"max_{cls.value}"


# Rows as callers hold them. Functions that filter rows keep the caller's own row type.
Row = Mapping[str, object]  # a ledger row as readers see it
Rows = list[dict[str, object]]  # rows as the JSONL readers return them
R = TypeVar("R", bound=Mapping[str, object])


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
        event: str | Event,
        *,
        job_id: Optional[str] = None,
        attempt: Optional[int] = None,
        nodes: Iterable[str] = (),
        durable: Optional[bool] = None,
        **fields: object,
    ) -> dict[str, object]: ...

    def run_events(self, kind: Optional[str] = None) -> Sequence[Mapping[str, object]]: ...


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
