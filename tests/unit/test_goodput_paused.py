"""A user's pause (Ctrl-C, `cli cancel`, `train.pause_at_step`) until the user's next submission
is a part of its own, "paused by you", left out of the goodput denominator (issue #36, build 7)."""

from __future__ import annotations

import dataclasses

import pytest

from slurmtrain.cli.goodput import analyze, format_line, format_table
from slurmtrain.common import events
from slurmtrain.common.events import FailureClass

T0 = 1_700_000_000.0


def ev(row: events.Row, t: float, attempt: int | None, job: str = "100") -> events.Row:
    return dataclasses.replace(row, time=T0 + t, job_id=job, attempt=attempt, nodes=("n1",))


def steps(attempt: int, first: int, last: int, t: float, dt: float = 10.0) -> list[dict]:
    return [
        {"step": s, "time": T0 + t + (s - first + 1) * dt, "attempt": attempt, "step_time": dt}
        for s in range(first, last + 1)
    ]


def ctrl_c_run(pause: float = 1000.0) -> tuple[events.Rows, list[dict]]:
    """Local run: attempt 1 trains steps 1-18 (t 10-190), saves 18, Ctrl-C at 205; the user runs
    the same command again `pause` s later; attempt 2 resumes at 18 and finishes at 30."""
    r = 205 + pause
    saved = {"seconds": 5, "total_seconds": 5, "bytes": 1, "path": "p"}
    ledger = [
        ev(events.Submitted(executor="local"), 0, None, "100"),
        ev(events.Started(world_size=1), 5, 1, "100"),
        ev(events.CheckpointSaved(step=18, **saved), 200, 1, "100"),
        ev(events.AttemptEnded(cls=FailureClass.cancelled, closed_by="ctrl-c"), 205, 1, "100"),
        ev(events.Submitted(executor="local"), r, None, "200"),
        ev(events.Started(world_size=1), r + 5, 2, "200"),
        ev(events.CheckpointLoaded(step=18, seconds=5, path="p"), r + 10, 2, "200"),
        ev(events.Finished(step=30), r + 130, 2, "200"),
    ]
    return ledger, steps(1, 1, 18, 10) + steps(2, 19, 30, r + 10)


def test_ctrl_c_pause_is_its_own_part_and_left_out_of_goodput() -> None:
    g = analyze(*ctrl_c_run()).goodput
    assert g.user_paused == pytest.approx(1000)
    assert g.other == pytest.approx(10)  # teardown; before, the pause was "other" too: 1010 s
    assert g.wall == pytest.approx(1335) and g.counted == pytest.approx(335)
    assert g.productive == pytest.approx(300)
    assert g.goodput == pytest.approx(300 / 335)
    assert sum(g.parts().values()) == pytest.approx(g.wall)
    assert not g.live


def test_the_pause_does_not_change_goodput() -> None:
    short, long = (analyze(*ctrl_c_run(p)).goodput for p in (1.0, 10_000.0))
    assert short.goodput == pytest.approx(long.goodput)


def test_formatters_name_the_pause_and_leave_it_out() -> None:
    g = analyze(*ctrl_c_run()).goodput
    assert "paused by you 16m40s left out" in format_line(g)
    table = format_table(g)
    assert "paused by you" in table and "goodput 89.6%" in table


def test_no_pause_row_in_the_table_of_a_run_without_one() -> None:
    ledger, metrics = ctrl_c_run()
    g = analyze(ledger[:3], metrics[:18]).goodput
    assert (
        g.user_paused == 0
        and "paused by you" not in format_table(g)
        and "left out" not in format_line(g)
    )


def test_a_cancelled_run_not_resubmitted_is_not_live() -> None:
    ledger, metrics = ctrl_c_run()
    g = analyze(ledger[:4], metrics[:18], now=T0 + 50_000).goodput
    assert not g.live and g.end == T0 + 205 and g.user_paused == 0


def test_resubmitted_and_queued_pauses_then_waits_until_now() -> None:
    ledger, metrics = ctrl_c_run()
    g = analyze(ledger[:5], metrics[:18], now=T0 + 1300).goodput
    assert g.live and g.user_paused == pytest.approx(1000) and g.queue_wait == pytest.approx(5 + 95)


def test_cancel_while_queued_then_resubmit() -> None:
    ledger = [
        ev(events.Submitted(executor="slurm"), 0, None, "7"),
        ev(events.Cancelled(job_ids=("7",), by="me"), 100, None, "7"),
        ev(events.Submitted(executor="slurm"), 700, None, "8"),
        ev(events.Started(world_size=1), 800, 1, "8"),
        ev(events.Finished(step=10), 910, 1, "8"),
    ]
    g = analyze(ledger, steps(1, 1, 10, 805)).goodput
    assert g.user_paused == pytest.approx(600)
    assert g.queue_wait == pytest.approx(100 + 100)  # before the cancel, and after the resubmit
    assert g.goodput == pytest.approx(100 / 310)


def test_a_supervisors_requeue_is_no_pause() -> None:
    ledger = [
        ev(events.Submitted(), 0, None),
        ev(events.Started(), 10, 1),
        ev(events.Paused(step=5), 70, 1),
        ev(events.Submitted(requeue_of="100"), 80, None, "101"),
        ev(events.Started(), 200, 2, "101"),
        ev(events.CheckpointLoaded(step=5, seconds=0, path="p"), 200, 2, "101"),
        ev(events.Finished(step=10), 260, 2, "101"),
    ]
    g = analyze(ledger, steps(1, 1, 5, 10) + steps(2, 6, 10, 200)).goodput
    assert g.user_paused == 0 and g.queue_wait == pytest.approx(10 + 120)


def test_pause_at_step_then_the_users_rerun_is_a_pause() -> None:
    ledger = [
        ev(events.Submitted(), 0, None),
        ev(events.Started(), 10, 1),
        ev(events.Paused(step=5), 70, 1),
        ev(events.Submitted(), 570, None, "101"),
        ev(events.Started(), 600, 2, "101"),
        ev(events.CheckpointLoaded(step=5, seconds=0, path="p"), 600, 2, "101"),
        ev(events.Finished(step=10), 660, 2, "101"),
    ]
    g = analyze(ledger, steps(1, 1, 5, 10) + steps(2, 6, 10, 600)).goodput
    assert g.user_paused == pytest.approx(500) and g.queue_wait == pytest.approx(10 + 30)
    assert g.goodput == pytest.approx(100 / 160)


def test_a_requeued_job_cancelled_while_queued_is_not_live() -> None:
    ledger = [
        ev(events.Submitted(), 0, None),
        ev(events.Started(), 10, 1),
        ev(events.Requeued(reason="time limit"), 70, 1),
        ev(events.Submitted(requeue_of="100"), 71, None, "101"),
        ev(events.Cancelled(job_ids=("101",), by="me"), 300, None, "101"),
    ]
    g = analyze(ledger, steps(1, 1, 5, 10), now=T0 + 50_000).goodput
    assert not g.live and g.end == T0 + 300 and g.user_paused == 0
    resubmitted = [*ledger, ev(events.Submitted(), 900, None, "102")]
    g = analyze(resubmitted, steps(1, 1, 5, 10), now=T0 + 1000).goodput
    assert (
        g.live
        and g.user_paused == pytest.approx(600)
        and g.queue_wait == pytest.approx(10 + 229 + 100)
    )
