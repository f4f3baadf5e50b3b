"""Budget windows: a user's resubmission after a stop starts the budgets again;
the supervisor's automatic restarts keep counting. Pure ledger logic on hand-written rows."""

from __future__ import annotations

from omegaconf import OmegaConf

from slurmtrain.common import ledger
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import FaultsConfig

FAULTS = OmegaConf.structured(FaultsConfig)


def crash_loop_rows() -> list[dict]:
    """Job 100 (the launch command) crashes at step 7, the supervisor resubmits 101, which
    crashes at step 7 too: the crash loop stops the run."""
    return [
        {"event": "submitted", "job_id": "100", "executor": "slurm"},
        {"event": "started", "job_id": "100", "attempt": 1},
        {"event": "attempt_ended", "job_id": "100", "attempt": 1, "class": "crash", "step": 7},
        {"event": "resubmitting", "job_id": "100", "attempt": 1},
        {"event": "submitted", "job_id": "101", "requeue_of": "100"},
        {"event": "requeued", "job_id": "100", "attempt": 1, "new_job_id": "101"},
        {"event": "started", "job_id": "101", "attempt": 2},
        {"event": "attempt_ended", "job_id": "101", "attempt": 2, "class": "crash", "step": 7},
        {"event": "stopped", "job_id": "101", "attempt": 2, "class": "crash loop", "error": "boom"},
    ]


def test_a_crash_loop_stops_the_run():
    assert ledger.over_budget(crash_loop_rows(), FAULTS) == "crash loop"


def test_the_user_resubmitting_after_a_stop_opens_a_new_window_that_counts_from_zero():
    rows = crash_loop_rows() + [{"event": "submitted", "job_id": "102", "executor": "slurm"}]
    opened = ledger.new_window(rows, "102")
    assert opened is not None
    assert opened["after_class"] == "crash loop" and opened["after_error"] == "boom"
    assert opened["window"] == 2
    rows += [{"event": "budget_window", **opened}, {"event": "started", "job_id": "102"}]
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
    rows += [{"event": "budget_window", **ledger.new_window(rows, "102")}]
    rows += [
        {"event": "started", "job_id": "102", "attempt": 3},
        {"event": "attempt_ended", "job_id": "102", "attempt": 3, "class": "crash", "step": 9},
        {"event": "stopped", "job_id": "102", "attempt": 3, "class": "crash", "error": "x"},
    ]
    assert ledger.new_window(rows, "102") is None
    # ...but crashes in the new window count against the budget again
    assert ledger.ended_classes(rows) == {"crash": 1}


def test_no_window_without_a_stop():
    rows = crash_loop_rows()[:3]
    assert ledger.new_window(rows, "999") is None


def test_crashes_of_an_earlier_window_do_not_make_a_loop_in_the_new_one():
    rows = crash_loop_rows() + [
        {"event": "budget_window", **ledger.new_window(crash_loop_rows(), "102")}
    ]
    rows += [
        {"event": "started", "job_id": "102", "attempt": 3},
        {"event": "attempt_ended", "job_id": "102", "attempt": 3, "class": "crash", "step": 7},
    ]
    assert ledger.over_budget(rows, FAULTS) is None  # one crash in this window, not a loop


def test_current_stop_is_gone_once_the_user_resubmits():
    rows = crash_loop_rows()
    assert ledger.current_stop(rows)["class"] == "crash loop"
    rows.append({"event": "submitted", "job_id": "102", "executor": "slurm"})
    assert ledger.current_stop(rows) is None  # queued: status no longer says stopped
    opened = ledger.new_window(rows, "102")
    assert ledger.current_stop(rows + [{"event": "budget_window", **opened}]) is None


def test_open_window_records_the_row_durably(tmp_path):
    run = RunDir(tmp_path / "run")
    run.ledger_dir.mkdir(parents=True)
    rows = crash_loop_rows()
    for row in rows:
        run.record(**{k: v for k, v in row.items()})
    events = run.run_events()
    assert ledger.open_window(run, events, "555")["after_class"] == "crash loop"
    assert [e for e in run.run_events() if e["event"] == "budget_window"][0]["job_id"] == "555"
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
        run.record(**row)
    assert summarize(run)["state"] == "stopped: crash loop"
    me = dict(pid=os.getpid(), host=socket.gethostname(), pid_start=pid_start(os.getpid()))
    run.record("submitted", job_id="777", executor="local", **me)  # the user's same command
    ledger.open_window(run, run.run_events(), "777")
    run.record("started", job_id="777", attempt=3, executor="local")
    row = summarize(run)
    assert row["state"] == "running"
    assert (row["window"], row["window_after"]) == (2, "crash loop")
    assert row["class"] is None and row["error"] is None
