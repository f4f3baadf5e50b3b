"""The local executor records a budget stop when the job ends (issue 37, build 6): the run says
`stopped` in status at once, and the user's rerun after a fix trains in a new budget window. The
stop was recorded only by the next start, which then stopped the first rerun at once."""

from __future__ import annotations

from slurmtrain.common.events import AttemptEnded, BudgetWindow, Finished, Stopped
from tests.conftest import ledger_of, run_cli, run_dirs

BASE = ["cluster=local", "gpus_per_node=0", "cluster.cpu_tasks_per_node=1", "train.max_steps=2",
        "train.log_interval=1", "faults.allow_inject=true", "faults.max_crash=0"]  # fmt: skip


def test_a_crash_past_the_budget_is_stopped_at_once_and_the_fixed_rerun_trains(workdir):
    crashed = run_cli(BASE, cwd=workdir, env={"SLURMTRAIN_INJECT": "crash_at_step=1"})
    out = crashed.stdout + crashed.stderr
    [run] = run_dirs(workdir / "runs")
    [stop] = ledger_of(run, Stopped)  # recorded by the job that crashed, not by the next start
    assert stop.cls == "crash" and "injected crash at step 1" in stop.error, out
    assert "slurmtrain: run stopped (crash): RuntimeError: injected crash at step 1" in out
    [ended] = ledger_of(run, AttemptEnded)
    assert (ended.cls, ended.attempt, ended.job_id) == ("crash", 1, stop.job_id)
    status = run_cli(["status", str(run)], cwd=workdir, module="slurmtrain.cli")
    assert "stopped: crash" in status.stdout, status.stdout + status.stderr

    fixed = run_cli(BASE, cwd=workdir)  # the fix: no injected crash
    assert ledger_of(run, Finished), fixed.stdout + fixed.stderr
    assert len(ledger_of(run, Stopped)) == 1  # not stopped again at its start
    [window] = ledger_of(run, BudgetWindow)
    assert window.after_class == "crash" and window.after_job_id == stop.job_id
    assert len(ledger_of(run, AttemptEnded)) == 1  # the crashed attempt closed once
