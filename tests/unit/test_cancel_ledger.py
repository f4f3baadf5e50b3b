"""Cancel's ledger logic (pure): which jobs belong to a run, and when the supervisor must not restart."""

from __future__ import annotations

from slurmtrain.cli.cancel import job_ids
from slurmtrain.common import events
from slurmtrain.common.events import FailureClass
from slurmtrain.common.ledger import cancelled_since


def test_job_ids_cover_submissions_requeues_and_resubmissions_once_each():
    rows = [
        events.Submitted(time=1, job_id="10", executor="slurm"),
        events.Started(time=2, job_id="10"),
        events.Requeued(time=3, job_id="10", new_job_id="10"),
        events.Requeued(time=4, job_id="10", new_job_id="11"),
        events.Submitted(time=4, job_id="11", executor="slurm", requeue_of="10"),
        events.Submitted(time=5, job_id="12_3", executor="slurm"),
        events.Submitted(time=6, job_id="999", executor="local"),
    ]
    assert job_ids(rows) == ["10", "11", "12_3"]
    # a submission of an older release (no executor) was a Slurm one
    assert job_ids([events.parse({"event": "submitted", "time": 1, "job_id": "5"})]) == ["5"]


def test_supervisor_honours_only_a_cancel_after_this_attempt_started():
    old = [
        events.Submitted(time=1, job_id="7"),
        events.Started(time=2, job_id="7", attempt=1),
        events.Cancelled(time=3),
        events.AttemptEnded(time=4, job_id="7", attempt=1, cls=FailureClass.cancelled),
        events.Submitted(time=10, job_id="8"),
        events.Started(time=11, job_id="8", attempt=2),
    ]
    assert cancelled_since(old, "7", 1)
    assert not cancelled_since(old, "8", 2)  # a cancel before the resubmission is history
    assert cancelled_since(old + [events.Cancelled(time=12)], "8", 2)
    pending = [events.Submitted(time=1, job_id="9"), events.Cancelled(time=2)]
    assert cancelled_since(pending, "9", None)
