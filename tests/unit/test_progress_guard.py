"""The progress guard across failure classes (issue 38, build 4), over typed ledger rows: attempts
of any mix of classes that publish no new checkpoint stop the run as `no_progress`; a run that
advances is never stopped by it, however many attempts it takes."""

from __future__ import annotations

from slurmtrain.common import ledger, progress
from slurmtrain.common.events import (
    AttemptEnded,
    BudgetWindow,
    CheckpointSaved,
    FailureClass,
    Row,
    Started,
)
from slurmtrain.common.schema import FaultsConfig

HANG, CRASH, NODE = FailureClass.hang, FailureClass.crash, FailureClass.node_failure


def attempts(plan: list[tuple[FailureClass, int | None]]) -> list[Row]:
    """One `started` + (a checkpoint at `saved`, if any) + `attempt_ended` per entry."""
    rows: list[Row] = []
    for n, (cls, saved) in enumerate(plan, start=1):
        rows.append(Started(attempt=n, job_id="7"))
        if saved is not None:
            rows.append(CheckpointSaved(step=saved, attempt=n))
        rows.append(AttemptEnded(cls=cls, step=9, attempt=n))
    return rows


def test_alternating_hang_and_crash_at_one_step_stop_after_three_attempts() -> None:
    faults = FaultsConfig()  # max_no_progress_attempts=3, crash_loop=2, max_hang=5, max_crash=3
    rows = [CheckpointSaved(step=8, attempt=0)] + attempts([(HANG, None), (CRASH, None)])
    assert ledger.over_budget(rows, faults) is None  # two attempts: not yet
    rows += attempts([(HANG, None)])
    assert ledger.over_budget(rows, faults) == FailureClass.no_progress
    detail = ledger.stop_detail(rows, faults, FailureClass.no_progress)
    assert detail == "hang, crash, hang: no checkpoint since step 8"


def test_a_run_without_any_checkpoint_says_none_yet() -> None:
    rows = attempts([(NODE, None), (HANG, None), (CRASH, None)])
    found = progress.no_progress(rows, 3)
    assert found is not None and found.describe() == "node_failure, hang, crash: no checkpoint yet"


def test_a_control_run_that_advances_survives_ten_attempts() -> None:
    faults = FaultsConfig(max_crash=10, max_hang=10)
    plan = [(HANG if n % 2 else CRASH, 10 * (n + 1)) for n in range(10)]
    rows = attempts(plan)
    assert len([e for e in rows if isinstance(e, AttemptEnded)]) == 10
    assert ledger.over_budget(rows, faults) is None
    assert progress.stall(rows).classes == ()


def test_an_old_step_saved_again_is_not_progress_and_one_advance_resets_the_streak() -> None:
    rows = attempts([(HANG, 20), (CRASH, 20), (HANG, 10)])  # re-saves of step 20 and older
    assert progress.stall(rows).classes == (CRASH, HANG)
    rows += attempts([(CRASH, 30)])  # advances, then crashes: the streak starts over
    assert progress.no_progress(rows, 3) is None and progress.stall(rows).since_step == 30


def test_preemptions_do_not_count_and_zero_turns_the_guard_off() -> None:
    rows = attempts([(HANG, None), (FailureClass.preempted, None), (CRASH, None)])
    assert progress.stall(rows).classes == (HANG, CRASH)
    rows += attempts([(HANG, None)])
    assert ledger.over_budget(rows, FaultsConfig(max_no_progress_attempts=0)) is None


def test_a_users_resubmission_after_the_stop_opens_a_new_window() -> None:
    rows = attempts([(HANG, None), (CRASH, None), (HANG, None)])
    assert progress.no_progress(rows, 3) is not None
    rows.append(BudgetWindow(window=2, after_class=FailureClass.no_progress))
    assert progress.stall(rows).classes == ()


def test_a_preempted_attempt_that_saved_a_new_step_resets_the_streak() -> None:
    rows = attempts([(HANG, None), (FailureClass.preempted, 20), (CRASH, None), (HANG, None)])
    assert progress.stall(rows) == progress.Stall((CRASH, HANG), 20)
