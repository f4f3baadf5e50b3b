"""The successor's decisions from typed ledger rows (issue 38, build 3): which queued successors
still count, when the run is over (finished, stopped, cancelled) and what `status` shows."""

from __future__ import annotations

from slurmtrain.batch import successor
from slurmtrain.common.events import (
    AttemptEnded,
    Cancelled,
    FailureClass,
    Finished,
    Paused,
    RelaunchAbandoned,
    Requeued,
    Resubmitting,
    Row,
    Started,
    Stopped,
    Submitted,
    SuccessorCancelled,
    SuccessorQueued,
)

FIRST = [Submitted(job_id="10"), SuccessorQueued(job_id="10", new_job_id="11")]


def test_a_live_run_shows_its_pending_successor() -> None:
    rows: list[Row] = [*FIRST, Started(job_id="10", attempt=1)]
    assert successor.queued(rows) == ["11"] and successor.over(rows) is None
    assert successor.shown(rows) == "successor 11 pending"


def test_a_successor_that_started_queues_the_next_one() -> None:
    rows: list[Row] = [*FIRST, Started(job_id="11", attempt=2)]
    assert successor.queued(rows) == []  # started: no longer a successor
    rows.append(SuccessorQueued(job_id="11", new_job_id="12"))
    assert successor.shown(rows) == "successor 12 pending"


def test_finished_stopped_cancelled_and_paused_runs_need_none() -> None:
    started: list[Row] = [*FIRST, Started(job_id="10", attempt=1)]
    assert successor.over([*started, Finished(step=3)]) == Finished.kind
    assert successor.over([*started, Stopped(cls=FailureClass.no_progress)]) == Stopped.kind
    assert successor.over([*started, Cancelled(job_ids=("10", "11"))]) == Cancelled.kind
    assert successor.over([*started, Paused(step=2)]) == Paused.kind  # resumed by the user
    assert successor.shown([*started, Finished(step=3)]) is None
    # a user's resubmission after the cancel makes it live again
    again = [*started, Cancelled(job_ids=("10",)), Submitted(job_id="20")]
    assert successor.over(again) is None


def test_cancelled_successors_no_longer_count() -> None:
    rows: list[Row] = [*FIRST, SuccessorCancelled(new_job_ids=("11",), reason=Finished.kind)]
    assert successor.queued(rows) == [] and successor.shown(rows) is None


def test_a_runs_own_job_name_holds_its_fingerprint() -> None:
    assert successor.job_name("opt", "/runs/opt/06b318790c2d") == "st-opt-06b31879"


def test_a_hand_scancel_is_over_and_a_late_successor_trains_nothing() -> None:
    # the supervisor (or the abandoned relaunch) closes a scancel'ed attempt `cancelled`
    started: list[Row] = [*FIRST, Started(job_id="10", attempt=1)]
    for end in (
        AttemptEnded(job_id="10", attempt=1, cls=FailureClass.cancelled),
        RelaunchAbandoned(
            job_id="10", attempt=1, cls=FailureClass.cancelled, reason=FailureClass.crash
        ),
    ):
        assert successor.over([*started, end]) == Cancelled.kind
        assert successor.not_needed([*started, end], "11") == Cancelled.kind
        assert successor.not_needed([*started, end], "30") is None  # a hand sbatch resumes
    crashed = AttemptEnded(job_id="10", attempt=1, cls=FailureClass.crash)
    assert successor.over([*started, crashed]) is None
    assert successor.not_needed([*started], "11") is None  # the batch node died: take over


def test_an_adopted_successor_is_the_runs_next_job_not_a_late_one() -> None:
    rows: list[Row] = [*FIRST, Started(job_id="10", attempt=1)]
    rows.append(SuccessorCancelled(new_job_ids=("11",), reason=Finished.kind))
    assert successor.not_needed(rows, "11") == SuccessorCancelled.kind
    adopted: list[Row] = [*FIRST, Started(job_id="10", attempt=1)]
    adopted.append(Submitted(job_id="11", requeue_of="10", after="10"))
    assert successor.not_needed([*adopted, Finished(step=3)], "11") is None


def test_a_successor_waits_out_the_job_before_it_then_yields_or_resumes() -> None:
    # Slurm releases the singleton while the job before is COMPLETING: its end state decides,
    # and what its trap recorded meanwhile (the ledger read again)
    rows: list[Row] = [*FIRST, Started(job_id="10", attempt=1)]
    cancelled = {"10": "CANCELLED"}.get  # KillWait ended the batch shell: no cancelled row
    assert successor.not_needed(rows, "11", cancelled) == Cancelled.kind
    assert successor.not_needed(rows, "11", {"10": "NODE_FAIL"}.get) is None  # resume
    assert successor.not_needed(rows, "11", {"10": "PREEMPTED"}.get) is None
    assert successor.not_needed(rows, "11", {"10": "PENDING"}.get) == Requeued.kind
    trap = [*rows, Submitted(job_id="12", requeue_of="10", after="10")]  # the time limit's
    states = {"10": "TIMEOUT", "12": "PENDING"}.get
    assert successor.not_needed(rows, "11", states, lambda: trap) == Resubmitting.kind
    gone = {"10": "TIMEOUT", "12": "CANCELLED"}.get  # that next job was cancelled: resume
    assert successor.not_needed(rows, "11", gone, lambda: trap) is None
