"""The ledger's vocabulary: one row class per event kind a run writes (the attempt's measurements
and checkpoints are in common/event_measures.py, re-exported here), and the failure classes.

A row is written by `RunDir.record(Kind(...fields), **placement)` and read back as the same class
(common/row_codec.py parses what files hold: the only place old or odd rows are handled), so
readers use attributes and `isinstance`. The failure class is the field `cls`, written under
"class" as it always was.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Optional, TypedDict, TypeVar

from slurmtrain.common.errors import EXIT_BAD_NODE, EXIT_CONFIG, EXIT_HANG, EXIT_REQUEUE
from slurmtrain.common.event_measures import *  # noqa: F403  the vocabulary's second half
from slurmtrain.common.row_codec import REGISTRY, Row, Unknown, parse

__all__ = ["REGISTRY", "Row", "Unknown", "parse"]  # re-exported (event_measures: by *)


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
    setup_failed = "setup_failed"
    no_progress = "no_progress"


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
    # A cluster.setup line failed in the batch shell before any rank started: it would fail the
    # same way again, so the run stops (batch/setup_failed.py) until the user fixes the line.
    FailureClass.setup_failed: Traits(False, False, False, None, "#637939"),
    # Stop class only: faults.max_no_progress_attempts attempts in a row, of any classes, published
    # no new checkpoint (common/progress.py); each class's own budget never saw them as one.
    FailureClass.no_progress: Traits(False, False, False, None, "#ad494a"),
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
Rows = list[Row]
R = TypeVar("R", bound=Row)


class Where(TypedDict, total=False):
    """Which start (and rank) wrote a row: writers pass it to `record` as keywords, filling the
    placement fields the row object leaves empty."""

    job_id: Optional[str]
    attempt: Optional[int]
    nodes: list[str]
    restart: int
    relaunch: Optional[int]
    rank: int
    node: Optional[str]


# ---- The rows, one class per kind (docstring: who writes it, when). Placement fields come from
# Row (common/row_codec.py); `durable` rows are fsynced before `record` returns.


@dataclass(frozen=True, kw_only=True)
class Submitted(Row):
    """A job of the run was queued: by the user's submit (a smoke chain's links too), by hand
    after a cancel (by=hand, recorded by its start), or held by the supervisor (requeue_of)."""

    kind = "submitted"
    durable = True
    executor: Optional[str] = None
    fingerprint: Optional[str] = None
    after: Optional[str] = None
    requeue_of: Optional[str] = None
    by: Optional[str] = None
    pid: Optional[int] = None
    host: Optional[str] = None
    pid_start: Optional[str] = None
    smoke_run: Optional[str] = None
    smoke_job_id: Optional[str] = None
    smoke_of: Optional[str] = None
    smoke_part: Optional[int] = None
    smoke_job_ids: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Branched(Row):
    """Login, a branch's first row: the parent run, the step it branched at, the keys changed."""

    kind = "branched"
    parent: Optional[str] = None
    parent_fingerprint: Optional[str] = None
    parent_name: Optional[str] = None
    step: Optional[int] = None
    changed: Optional[dict[str, object]] = None


@dataclass(frozen=True, kw_only=True)
class Started(Row):
    """Attempt, once every rank joined: an attempt begins (its number counts these rows)."""

    kind = "started"
    durable = True
    tracked = True
    world_size: Optional[int] = None
    hosts: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()
    executor: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class AttemptEnded(Row):
    """How an attempt ended (`cls`): by its supervisor, by the next start or a cancel closing one
    left open (closed_by), by the time-limit restart (at)."""

    kind = "attempt_ended"
    durable = True
    closing = True
    cls: str
    exit_code: Optional[int] = None
    step: Optional[int] = None
    closed_by: Optional[int | str] = None
    at: Optional[str] = None
    before_started: Optional[bool] = None
    failed_nodes: tuple[str, ...] = ()
    supervisor_error: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class Stopped(Row):
    """The run stops without a restart (`cls`, `error`): a budget spent, no nodes, diverged, no
    readable checkpoint, a failed supervisor fallback."""

    kind = "stopped"
    durable = True
    tracked = True
    cls: str
    error: str = ""
    step: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class Finished(Row):
    """Attempt: train.max_steps reached and saved (on_signal: a stop signal came in that step)."""

    kind = "finished"
    durable = True
    tracked = True
    step: Optional[int] = None
    on_signal: Optional[bool] = None


@dataclass(frozen=True, kw_only=True)
class Paused(Row):
    """Attempt: train.pause_at_step reached; the next job resumes."""

    kind = "paused"
    tracked = True
    step: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class Failed(Row):
    """Any rank that saw an error (a crash, a hang; its phase and traceback); in the run tier when
    the start cannot claim the run, or the final checkpoint was not saved."""

    kind = "failed"
    durable = True
    tracked = True
    cls: str
    error: str = ""
    step: Optional[int] = None
    phase: Optional[str] = None
    traceback: Optional[str] = None
    host: Optional[str] = None
    step_nodes: tuple[str, ...] = ()
    arrived_at: Optional[float] = None


@dataclass(frozen=True, kw_only=True)
class Signal(Row):
    """Attempt: the ranks agreed to stop on a signal (SIGUSR2: the time limit), before the save."""

    kind = "signal"
    durable = True
    tracked = True
    signal: Optional[str] = None
    step: Optional[int] = None
    received_at: Optional[float] = None
    before_save: Optional[bool] = None


@dataclass(frozen=True, kw_only=True)
class Requeued(Row):
    """The run's next job exists (how: requeue, same id, or resubmit); `at`: the time limit or
    preemption that made it outside the supervisor's normal path."""

    kind = "requeued"
    durable = True
    closing = True
    reason: Optional[str] = None
    excluded: Optional[tuple[str, ...]] = None
    exclusions_dropped: Optional[tuple[str, ...]] = None
    new_job_id: Optional[str] = None
    how: Optional[str] = None
    at: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class Resubmitting(Row):
    """Supervisor: about to sbatch the next job (why, nodes excluded)."""

    kind = "resubmitting"
    closing = True
    reason: Optional[str] = None
    excluded: Optional[tuple[str, ...]] = None


@dataclass(frozen=True, kw_only=True)
class ReleaseFailed(Row):
    """Supervisor: the held next job stays held after every release."""

    kind = "release_failed"
    new_job_id: Optional[str] = None
    error: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class RestartedInAllocation(Row):
    """Supervisor: the next attempt runs inside this job, on the nodes left and spares."""

    kind = "restarted_in_allocation"
    closing = True
    reason: Optional[str] = None
    left_out: tuple[str, ...] = ()
    swapped_in: tuple[str, ...] = ()
    step_nodes: tuple[str, ...] = ()
    spares_left: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class RelaunchAbandoned(Row):
    """The job was signalled (`cls`) before the in-allocation relaunch for `reason` started."""

    kind = "relaunch_abandoned"
    closing = True
    cls: str
    reason: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class SupervisorFailed(Row):
    """Batch fallback: the supervisor itself raised."""

    kind = "supervisor_failed"
    durable = True
    error: Optional[str] = None
    traceback: Optional[str] = None
    exit_code: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class BudgetWindow(Row):
    """A user's submission after a stop starts: budgets count again."""

    kind = "budget_window"
    durable = True
    window: Optional[int] = None
    after_class: Optional[str] = None
    after_error: Optional[str] = None
    after_job_id: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class Cancelled(Row):
    """Login, `slurmtrain cancel`: the jobs scancel'ed, by whom."""

    kind = "cancelled"
    durable = True
    job_ids: tuple[str, ...] = ()
    by: Optional[str] = None
    host: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class DuplicateRefused(Row):
    """A start found another live job training the run and exits untouched."""

    kind = "duplicate_refused"
    durable = True
    owner: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class NodeLost(Row):
    """A node the attempt lost (`node`): by its supervisor, or by the next start."""

    kind = "node_lost"
    durable = True
    closing = True


@dataclass(frozen=True, kw_only=True)
class BadNode(Row):
    """Attempt: a node (`node`) failed the health gate; the job exits."""

    kind = "bad_node"
    durable = True
    reason: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class SuccessorQueued(Row):
    """The batch shell (batch/successor.py): a pending `--dependency=singleton` copy of job.sbatch
    (`new_job_id`) starts if this job dies with its batch node; never the run's owner until it
    starts (so it never blocks the run lock)."""

    kind = "successor_queued"
    durable = True
    new_job_id: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class SuccessorCancelled(Row):
    """The batch shell: the run finished, stopped or was cancelled; its pending successors
    (`new_job_ids`) are scancel'ed, so nothing of it stays in the queue."""

    kind = "successor_cancelled"
    durable = True
    new_job_ids: tuple[str, ...] = ()
    reason: Optional[str] = None
