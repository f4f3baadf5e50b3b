"""The progress guard on a real local run (issue 38, build 4): a hang then a crash at one step,
neither publishing a checkpoint, stop the run as `no_progress`, though no class's own budget is
spent (max_hang=5, max_crash=3, crash_loop needs two crashes in a row). Two attempts with the
limit at 2 keep it cheap (each local start costs ~25 s here); tests/unit/test_progress_guard.py
holds the default of 3 (hang, crash, hang) and the control run that advances for 10 attempts."""

from __future__ import annotations

from slurmtrain.common.events import AttemptEnded, FailureClass, Stopped
from tests.conftest import ledger_of, run_cli, run_dirs

BASE = ["cluster=local", "gpus_per_node=0", "cluster.cpu_tasks_per_node=1", "train.max_steps=3",
        "train.log_interval=1", "faults.allow_inject=true", "faults.hang_timeout_s=2",
        "checkpoint.interval_steps=0", "checkpoint.interval_minutes=0",
        "faults.max_no_progress_attempts=2"]  # fmt: skip
HANG = {"SLURMTRAIN_INJECT": "stall_at_step=1"}
CRASH = {"SLURMTRAIN_INJECT": "crash_at_step=1"}


def test_hang_then_crash_at_one_step_stop_the_run_as_no_progress(workdir):
    outs = []
    for n, env in enumerate((HANG, CRASH), start=1):
        done = run_cli(BASE, cwd=workdir, env=env)
        outs.append(done.stdout + done.stderr)
        [run] = run_dirs(workdir / "runs")
        assert len(ledger_of(run, AttemptEnded)) == n, outs[-1]
        assert len(ledger_of(run, Stopped)) == (n == 2), outs[-1]
    classes = [e.cls for e in ledger_of(run, AttemptEnded)]
    assert classes == ["hang", "crash"], outs[-1]
    [stop] = ledger_of(run, Stopped)
    assert stop.cls == FailureClass.no_progress, outs[-1]
    assert stop.error == "hang, crash: no checkpoint yet"
    status = run_cli(["status", str(run)], cwd=workdir, module="slurmtrain.cli")
    line = "stopped: no_progress (hang, crash: no checkpoint yet)"
    assert line in status.stdout, status.stdout + status.stderr
