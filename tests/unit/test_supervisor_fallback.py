"""The supervisor's catch-all (slurmtrain/batch/fallback.py): when it must
resubmit, and when the ledger says nothing is to be done. Pure ledger logic."""

from __future__ import annotations

from slurmtrain.batch import fallback, next_job
from slurmtrain.common import errors, events
from slurmtrain.common.events import FailureClass
from slurmtrain.common.rundir import RunDir


def started(job="100", attempt=1, t=10.0):
    return events.Started(job_id=job, attempt=attempt, time=t)


def decide(tmp_path, rows, rc=1, job="100"):
    return fallback._decide(RunDir(tmp_path), rows, job, 0, 0, rc)


def test_a_crashed_attempt_with_no_restart_yet_is_resubmitted(tmp_path):
    rows = [events.Submitted(job_id="100", time=1.0), started()]
    assert decide(tmp_path, rows) is None


def test_nothing_is_resubmitted_when_the_step_exited_cleanly_or_another_job_holds_the_run(
    tmp_path,
):
    assert decide(tmp_path, [started()], rc=0) == 0
    assert decide(tmp_path, [started()], rc=errors.EXIT_DUPLICATE) == 0


def test_nothing_is_resubmitted_after_the_run_finished_stopped_or_restarted(tmp_path):
    assert decide(tmp_path, [started(), events.Finished(time=11.0)]) == 0
    stop = events.Stopped(job_id="100", cls=FailureClass.crash, time=11.0)
    assert decide(tmp_path, [started(), stop]) == next_job.EXIT_STOPPED
    requeued = events.Requeued(job_id="100", restart=0, new_job_id="100")
    assert decide(tmp_path, [started(), requeued]) == 0


def test_a_restart_of_an_earlier_start_of_the_same_job_does_not_count(tmp_path):
    # restart 0 crashed and was requeued (same id); restart 1 failed: it needs its own restart
    old = events.Requeued(job_id="100", restart=0, new_job_id="100")
    rows = [started(), old]
    assert fallback._decide(RunDir(tmp_path), rows, "100", 1, 0, 1) is None
    assert fallback._decide(RunDir(tmp_path), rows, "100", 0, 0, 1) == 0


def test_supervisor_drills_read_the_compute_injection_syntax(monkeypatch):
    monkeypatch.setenv("SLURMTRAIN_INJECT", "crash_at_step=7,attempts=1,supervisor_raise=1")
    assert next_job.injected("supervisor_raise", {"attempt": 1})
    assert not next_job.injected("supervisor_raise", {"attempt": 2})  # attempts=1 confines it
    assert not next_job.injected("skip_release", {"attempt": 1})
