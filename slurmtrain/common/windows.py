"""Budget windows: which of a run's rows its failure budgets count (slurmtrain.common.ledger).

A user's resubmission after a `stopped` (the launch command again, or `sbatch RUN_DIR/job.sbatch`
by hand) opens a new window, recorded as `budget_window` with the reason the run stopped before:
the user fixed the cause, so the budgets start again. Automatic restarts (the supervisor's
resubmissions and requeues, Slurm's own requeues, in-allocation relaunches) keep counting: they
are what the budgets bound. A job id no row names as started by slurmtrain is the user's.
"""

from __future__ import annotations

from typing import Optional, Sequence, TypedDict

from slurmtrain.common import events
from slurmtrain.common.events import R, Row


class BudgetWindow(TypedDict):
    """A `budget_window` row's own fields."""

    job_id: str
    window: int
    after_class: object
    after_error: object
    after_job_id: object


def auto_job_ids(rows: Sequence[Row]) -> set[str]:
    """Job ids slurmtrain started on its own: the supervisor's resubmissions (`submitted` with
    `requeue_of`) and requeues (`requeued`'s `new_job_id`)."""
    ids = {str(e["job_id"]) for e in rows if e["event"] == "submitted" and e.get("requeue_of")}
    requeued = [e for e in rows if e["event"] == "requeued" and e.get("new_job_id")]
    return ids | {str(e["new_job_id"]) for e in requeued}


def user_submission(rows: Sequence[Row], job_id: str) -> bool:
    """Whether job `job_id` was submitted by the user (the launch command, or `sbatch job.sbatch`
    by hand: no row names it), not by slurmtrain's own restarts. Slurm's requeue of a user's job
    keeps its id: callers ask whether that id already started (new_window)."""
    return str(job_id) not in auto_job_ids(rows)


def window(rows: Sequence[R]) -> list[R]:
    """The rows of the current budget window: those after the newest `budget_window`."""
    opened = [i for i, e in enumerate(rows) if e["event"] == "budget_window"]
    return list(rows[opened[-1] + 1 :] if opened else rows)


def current_stop(rows: Sequence[R]) -> Optional[R]:
    """The `stopped` row that still stands: the newest one in the current window, unless a user's
    submission came after it (a `submitted` without `requeue_of`: the new window is queued)."""
    rows = window(rows)
    stops = [i for i, e in enumerate(rows) if e["event"] == "stopped"]
    if not stops:
        return None
    later = rows[stops[-1] + 1 :]
    if any(e["event"] == "submitted" and not e.get("requeue_of") for e in later):
        return None
    return rows[stops[-1]]


def new_window(rows: Sequence[Row], job_id: Optional[str]) -> Optional[BudgetWindow]:
    """The `budget_window` row that job `job_id` opens as it starts, else None: a user's
    submission (user_submission) after the run stopped, whose id has not started since (a
    Slurm requeue or an in-allocation relaunch of it keeps counting)."""
    current = window(rows)
    stopped = [i for i, e in enumerate(current) if e["event"] == "stopped"]
    if not job_id or not stopped or not user_submission(rows, job_id):  # no id: a bare start
        return None
    since = current[stopped[-1] :]
    marks = ("started", "attempt_ended", "stopped", "budget_window")  # run tier, not rank rows
    if any(str(e.get("job_id")) == str(job_id) and e["event"] in marks for e in since):
        return None  # this job recorded the stop, or started already after it
    stop = current[stopped[-1]]
    return {
        "job_id": str(job_id),
        "window": 2 + sum(e["event"] == "budget_window" for e in rows),  # the first is 1
        "after_class": stop.get("class"),
        "after_error": stop.get("error"),
        "after_job_id": stop.get("job_id"),
    }


def open_window(
    run: events.Recorder, rows: list[dict[str, object]], job_id: Optional[str]
) -> Optional[BudgetWindow]:
    """Record `budget_window` when job `job_id` opens one (new_window); the row, else None.
    `rows`: the run tier; the row is appended to it."""
    row = new_window(rows, job_id)
    if row is None:
        return None
    rows.append(run.record(events.Kind.budget_window, **row))
    return row
