"""Budget windows: which of a run's rows its failure budgets count (slurmtrain.common.ledger).

A user's resubmission after a `Stopped` row (the launch command again, or `sbatch RUN_DIR/job.sbatch`
by hand) opens a new window, recorded as a `BudgetWindow` row with the reason the run stopped before:
the user fixed the cause, so the budgets start again. Automatic restarts (the supervisor's
resubmissions and requeues, Slurm's own requeues, in-allocation relaunches) keep counting: they
are what the budgets bound. A job id no row names as started by slurmtrain is the user's.
"""

from __future__ import annotations

from typing import Iterable, Optional, Protocol, Sequence

from slurmtrain.common import events
from slurmtrain.common.events import R, Row, Rows


class Recorder(Protocol):
    """What writes and reads a run's ledger (common/rundir.py's RunDir)."""

    def record(
        self,
        event: Row,
        *,
        job_id: Optional[str] = None,
        attempt: Optional[int] = None,
        nodes: Iterable[str] = (),
    ) -> Row: ...

    def run_events(self) -> Rows: ...


def auto_job_ids(rows: Sequence[Row]) -> set[str]:
    """Job ids slurmtrain started on its own: the supervisor's resubmissions (`Submitted` with
    `requeue_of`) and requeues (`Requeued`'s `new_job_id`)."""
    ids = {str(e.job_id) for e in rows if isinstance(e, events.Submitted) and e.requeue_of}
    return ids | {e.new_job_id for e in rows if isinstance(e, events.Requeued) and e.new_job_id}


def user_submission(rows: Sequence[Row], job_id: str) -> bool:
    """Whether job `job_id` was submitted by the user (the launch command, or `sbatch job.sbatch`
    by hand: no row names it), not by slurmtrain's own restarts. Slurm's requeue of a user's job
    keeps its id: callers ask whether that id already started (new_window)."""
    return str(job_id) not in auto_job_ids(rows)


def window(rows: Sequence[R]) -> list[R]:
    """The rows of the current budget window: those after the newest `BudgetWindow`."""
    opened = [i for i, e in enumerate(rows) if isinstance(e, events.BudgetWindow)]
    return list(rows[opened[-1] + 1 :] if opened else rows)


def current_stop(rows: Sequence[Row]) -> Optional[events.Stopped]:
    """The `Stopped` row that still stands: the newest one in the current window, unless a user's
    submission came after it (a `Submitted` without `requeue_of`: the new window is queued)."""
    current = window(rows)
    stops = [(i, e) for i, e in enumerate(current) if isinstance(e, events.Stopped)]
    if not stops:
        return None
    later = current[stops[-1][0] + 1 :]
    if any(isinstance(e, events.Submitted) and not e.requeue_of for e in later):
        return None
    return stops[-1][1]


# Run-tier rows of a job that recorded the stop or started after it (not rank rows).
MARKS = (events.Started, events.AttemptEnded, events.Stopped, events.BudgetWindow)


def new_window(rows: Sequence[Row], job_id: Optional[str]) -> Optional[events.BudgetWindow]:
    """The `BudgetWindow` row that job `job_id` opens as it starts, else None: a user's
    submission (user_submission) after the run stopped, whose id has not started since (a
    Slurm requeue or an in-allocation relaunch of it keeps counting)."""
    current = window(rows)
    stopped = [(i, e) for i, e in enumerate(current) if isinstance(e, events.Stopped)]
    if not job_id or not stopped or not user_submission(rows, job_id):  # no id: a bare start
        return None
    at, stop = stopped[-1]
    if any(str(e.job_id) == str(job_id) and isinstance(e, MARKS) for e in current[at:]):
        return None  # this job recorded the stop, or started already after it
    return events.BudgetWindow(
        job_id=str(job_id),
        window=2 + sum(isinstance(e, events.BudgetWindow) for e in rows),  # the first is 1
        after_class=stop.cls,
        after_error=stop.error,
        after_job_id=stop.job_id,
    )


def open_window(run: Recorder, rows: Rows, job_id: Optional[str]) -> Optional[events.BudgetWindow]:
    """Record `BudgetWindow` when job `job_id` opens one (new_window); the row, else None.
    `rows`: the run tier; the row is appended to it."""
    row = new_window(rows, job_id)
    if row is None:
        return None
    rows.append(run.record(row))
    return row
