"""Budget windows: which of a run's rows its failure budgets count (slurmtrain.common.ledger).

A user's resubmission after a `stopped` (the launch command again, or `sbatch RUN_DIR/job.sbatch`
by hand) opens a new window, recorded as `budget_window` with the reason the run stopped before:
the user fixed the cause, so the budgets start again. Automatic restarts (the supervisor's
resubmissions and requeues, Slurm's own requeues, in-allocation relaunches) keep counting: they
are what the budgets bound. A job id no row names as started by slurmtrain is the user's.
"""

from __future__ import annotations

from typing import Any, Optional


def auto_job_ids(events: list[dict[str, Any]]) -> set[str]:
    """Job ids slurmtrain started on its own: the supervisor's resubmissions (`submitted` with
    `requeue_of`) and requeues (`requeued`'s `new_job_id`)."""
    ids = {str(e["job_id"]) for e in events if e["event"] == "submitted" and e.get("requeue_of")}
    requeued = [e for e in events if e["event"] == "requeued" and e.get("new_job_id")]
    return ids | {str(e["new_job_id"]) for e in requeued}


def user_submission(events: list[dict[str, Any]], job_id: str) -> bool:
    """Whether job `job_id` was submitted by the user (the launch command, or `sbatch job.sbatch`
    by hand: no row names it), not by slurmtrain's own restarts. Slurm's requeue of a user's job
    keeps its id: callers ask whether that id already started (new_window)."""
    return str(job_id) not in auto_job_ids(events)


def window(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the current budget window: those after the newest `budget_window`."""
    opened = [i for i, e in enumerate(events) if e["event"] == "budget_window"]
    return events[opened[-1] + 1 :] if opened else events


def current_stop(events: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The `stopped` row that still stands: the newest one in the current window, unless a user's
    submission came after it (a `submitted` without `requeue_of`: the new window is queued)."""
    rows = window(events)
    stops = [i for i, e in enumerate(rows) if e["event"] == "stopped"]
    if not stops:
        return None
    later = rows[stops[-1] + 1 :]
    if any(e["event"] == "submitted" and not e.get("requeue_of") for e in later):
        return None
    return rows[stops[-1]]


def new_window(events: list[dict[str, Any]], job_id: Optional[str]) -> Optional[dict[str, Any]]:
    """The `budget_window` row that job `job_id` opens as it starts, else None: a user's
    submission (user_submission) after the run stopped, whose id has not started since (a
    Slurm requeue or an in-allocation relaunch of it keeps counting)."""
    stopped = [i for i, e in enumerate(window(events)) if e["event"] == "stopped"]
    if not job_id or not stopped or not user_submission(events, job_id):  # no id: a bare start
        return None
    rows = window(events)
    since = rows[stopped[-1] :]
    marks = ("started", "attempt_ended", "stopped", "budget_window")  # run tier, not rank rows
    if any(str(e.get("job_id")) == str(job_id) and e["event"] in marks for e in since):
        return None  # this job recorded the stop, or started already after it
    stop = rows[stopped[-1]]
    return {
        "job_id": str(job_id),
        "window": 2 + sum(e["event"] == "budget_window" for e in events),  # the first is 1
        "after_class": stop.get("class"),
        "after_error": stop.get("error"),
        "after_job_id": stop.get("job_id"),
    }


def open_window(
    run: Any, events: list[dict[str, Any]], job_id: Optional[str]
) -> Optional[dict[str, Any]]:
    """Record `budget_window` when job `job_id` opens one (new_window); the row, else None.
    `run`: a RunDir; `events`: its run tier, the row is appended to it."""
    row = new_window(events, job_id)
    if row is None:
        return None
    events.append(run.record("budget_window", durable=True, **row))
    return row
