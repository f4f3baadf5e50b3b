"""Budget windows: a user's resubmission after a stop starts the budgets again;
the supervisor's automatic restarts keep counting. Pure ledger logic on hand-written rows."""

from __future__ import annotations

from omegaconf import OmegaConf

from slurmtrain.common import events, ledger
from slurmtrain.common.events import FailureClass, Row
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import FaultsConfig

FAULTS = OmegaConf.structured(FaultsConfig)


CRASH = FailureClass.crash


def crash_loop_rows() -> list[Row]:
    """Job 100 (the launch command) crashes at step 7, the supervisor resubmits 101, which
    crashes at step 7 too: the crash loop stops the run."""
    return [
        events.Submitted(job_id="100", executor="slurm"),
        events.Started(job_id="100", attempt=1),
        events.AttemptEnded(job_id="100", attempt=1, cls=CRASH, step=7),
        events.Resubmitting(job_id="100", attempt=1),
        events.Submitted(job_id="101", requeue_of="100"),
        events.Requeued(job_id="100", attempt=1, new_job_id="101"),
        events.Started(job_id="101", attempt=2),
        events.AttemptEnded(job_id="101", attempt=2, cls=CRASH, step=7),
        events.Stopped(job_id="101", attempt=2, cls="crash loop", error="boom"),
    ]


def opened_by(rows: list[Row], job_id: str) -> events.BudgetWindow:
    opened = ledger.new_window(rows, job_id)
    assert opened is not None
    return opened


def test_a_crash_loop_stops_the_run():
    assert ledger.over_budget(crash_loop_rows(), FAULTS) == "crash loop"


def test_the_user_resubmitting_after_a_stop_opens_a_new_window_that_counts_from_zero():
    rows = crash_loop_rows() + [events.Submitted(job_id="102", executor="slurm")]
    opened = opened_by(rows, "102")
    assert opened.after_class == "crash loop" and opened.after_error == "boom"
    assert opened.window == 2 and opened.job_id == "102" and opened.after_job_id == "101"
    rows += [opened, events.Started(job_id="102")]
    assert ledger.over_budget(rows, FAULTS) is None
    assert ledger.ended_classes(rows) == {}


def test_a_hand_sbatch_no_row_names_is_a_user_submission_too():
    assert ledger.user_submission(crash_loop_rows(), "555")
    assert ledger.new_window(crash_loop_rows(), "555") is not None


def test_automatic_restarts_keep_counting():
    rows = crash_loop_rows()
    assert not ledger.user_submission(rows, "101")  # the supervisor's resubmission
    assert ledger.user_submission(rows, "100")
    assert ledger.new_window(rows, "101") is None  # it recorded the stop: no new window
    # A window opened once is not opened again by the same job's later starts (Slurm requeue)
    rows += [opened_by(rows, "102")]
    rows += [
        events.Started(job_id="102", attempt=3),
        events.AttemptEnded(job_id="102", attempt=3, cls=CRASH, step=9),
        events.Stopped(job_id="102", attempt=3, cls=CRASH, error="x"),
    ]
    assert ledger.new_window(rows, "102") is None
    # ...but crashes in the new window count against the budget again
    assert ledger.ended_classes(rows) == {CRASH: 1}


def test_no_window_without_a_stop():
    rows = crash_loop_rows()[:3]
    assert ledger.new_window(rows, "999") is None


def test_crashes_of_an_earlier_window_do_not_make_a_loop_in_the_new_one():
    rows = crash_loop_rows() + [opened_by(crash_loop_rows(), "102")]
    rows += [
        events.Started(job_id="102", attempt=3),
        events.AttemptEnded(job_id="102", attempt=3, cls=CRASH, step=7),
    ]
    assert ledger.over_budget(rows, FAULTS) is None  # one crash in this window, not a loop


def test_current_stop_is_gone_once_the_user_resubmits():
    rows = crash_loop_rows()
    stop = ledger.current_stop(rows)
    assert stop is not None and stop.cls == "crash loop"
    rows.append(events.Submitted(job_id="102", executor="slurm"))
    assert ledger.current_stop(rows) is None  # queued: status no longer says stopped
    assert ledger.current_stop(rows + [opened_by(rows, "102")]) is None


def test_open_window_records_the_row_durably(tmp_path):
    run = RunDir(tmp_path / "run")
    run.ledger_dir.mkdir(parents=True)
    for row in crash_loop_rows():
        run.record(row)
    rows = run.run_events()
    opened = ledger.open_window(run, rows, "555")
    assert opened is not None and opened.after_class == "crash loop"
    assert isinstance(rows[-1], events.BudgetWindow)  # appended to the caller's rows
    windows = [e for e in run.run_events() if isinstance(e, events.BudgetWindow)]
    assert [(w.job_id, w.window) for w in windows] == [("555", 2)]
    assert ledger.over_budget(run.run_events(), FAULTS) is None
    assert ledger.open_window(run, run.run_events(), "555") is None  # once


def test_status_shows_the_new_window_training_not_the_old_stop(tmp_path):
    import os
    import socket

    from slurmtrain.cli.status import summarize
    from slurmtrain.common.liveness import pid_start

    run = RunDir(tmp_path / "run")
    run.ledger_dir.mkdir(parents=True)
    for row in crash_loop_rows():
        run.record(row)
    assert summarize(run)["state"] == "stopped: crash loop"
    pid = os.getpid()
    mine = events.Submitted(
        executor="local", pid=pid, host=socket.gethostname(), pid_start=pid_start(pid)
    )
    run.record(mine, job_id="777")  # the user's same command
    ledger.open_window(run, run.run_events(), "777")
    run.record(events.Started(executor="local"), job_id="777", attempt=3)
    row = summarize(run)
    assert row["state"] == "running"
    assert (row["window"], row["window_after"]) == (2, "crash loop")
    assert row["class"] is None and row["error"] is None
