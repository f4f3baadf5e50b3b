"""Rollbacks that go further back: a divergence that comes back soon after a
rollback returns to an older checkpoint than the rollback before it did, since the newest one may
already carry the instability; and the checkpoint a rollback returned to is never pruned.

A second divergence does not stop the run `diverged` while older valid checkpoints remain, and
later saves under keep_last do not prune the rollback's target.
"""

from __future__ import annotations

from slurmtrain.common.events import FailureClass, Finished, Rollback, Stopped
from tests.conftest import ledger_of, run_cli, run_dirs

BASE = ["train.max_steps=40", "train.log_interval=1", "checkpoint.interval_steps=10"]


def test_repeated_divergence_rolls_back_to_an_older_checkpoint_each_time(workdir):
    inject = {"SLURMTRAIN_INJECT": "nan_at_step=25,nan_repeat=1"}  # step 25 always diverges
    done = run_cli([*BASE, "faults.allow_inject=true"], cwd=workdir, env=inject)
    [run] = run_dirs(workdir / "runs")
    rollbacks = ledger_of(run, Rollback)
    assert [r.to_step for r in rollbacks] == [20, 10], done.stdout + done.stderr
    [stopped] = ledger_of(run, Stopped)  # no checkpoint older than step 10 left to try
    assert stopped.cls == FailureClass.diverged and "diverged again" in stopped.error
    assert "older" in stopped.error


def test_checkpoint_rolled_back_to_survives_later_saves(workdir):
    args = BASE + [
        "checkpoint.interval_steps=5",
        "checkpoint.keep_last=1",
        "faults.allow_inject=true",
    ]
    done = run_cli(args, cwd=workdir, env={"SLURMTRAIN_INJECT": "nan_at_step=18"})
    [run] = run_dirs(workdir / "runs")
    [rollback] = ledger_of(run, Rollback)
    assert rollback.to_step == 15, done.stdout + done.stderr
    assert ledger_of(run, Finished)
    kept = sorted(p.name for p in (run / "checkpoints").glob("step_*") if p.is_dir())
    assert "step_15" in kept and "step_40" in kept, kept
