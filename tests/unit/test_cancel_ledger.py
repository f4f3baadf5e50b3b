"""Cancel's ledger logic (pure): which jobs belong to a run, and when the supervisor must not restart."""

from __future__ import annotations

from slurmtrain.cli.cancel import job_ids
from slurmtrain.common.events import Row, parse
from slurmtrain.common.ledger import cancelled_since


def _e(event: str, t: float, **kw: object) -> Row:
    return parse({"event": event, "time": t, **kw})


def test_job_ids_cover_submissions_requeues_and_resubmissions_once_each():
    events = [
        _e("submitted", 1, job_id="10", executor="slurm"),
        _e("started", 2, job_id="10"),
        _e("requeued", 3, job_id="10", new_job_id="10"),
        _e("requeued", 4, job_id="10", new_job_id="11"),
        _e("submitted", 4, job_id="11", executor="slurm", requeue_of="10"),
        _e("submitted", 5, job_id="12_3", executor="slurm"),
        _e("submitted", 6, job_id="999", executor="local"),
    ]
    assert job_ids(events) == ["10", "11", "12_3"]


def test_supervisor_honours_only_a_cancel_after_this_attempt_started():
    old = [
        _e("submitted", 1, job_id="7"),
        _e("started", 2, job_id="7", attempt=1),
        _e("cancelled", 3),
        _e("attempt_ended", 4, job_id="7", attempt=1),
        _e("submitted", 10, job_id="8"),
        _e("started", 11, job_id="8", attempt=2),
    ]
    assert cancelled_since(old, "7", 1)
    assert not cancelled_since(old, "8", 2)  # a cancel before the resubmission is history
    assert cancelled_since(old + [_e("cancelled", 12)], "8", 2)
    pending = [_e("submitted", 1, job_id="9"), _e("cancelled", 2)]
    assert cancelled_since(pending, "9", None)
