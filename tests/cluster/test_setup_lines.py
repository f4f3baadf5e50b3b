"""cluster.setup on the local Slurm cluster (issue 35, build 2): the batch shell runs the site's lines
before the first srun; a failing line stops the run as `setup_failed` with the line and its exit
code, once: no rank starts, nothing is requeued or resubmitted in a loop."""

from __future__ import annotations

import pytest

from slurmtrain.common import events
from slurmtrain.common.events import FailureClass
from tests.cluster.helpers import events as ledger
from tests.cluster.helpers import only_run, wait_event, wait_job_gone
from tests.conftest import run_cli

pytestmark = pytest.mark.slurm
FAILING = "ls /nonexistent-slurmtrain-setup"  # exits 2


def test_a_failing_setup_line_stops_the_run_once(slurm_cluster, workdir):
    args = [
        "cluster=slurm",
        "name=setup_fails",
        "train.max_steps=5",
        f'cluster.setup=["export SLURMTRAIN_T_SETUP=one","{FAILING}"]',
    ]
    done = run_cli(args, cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run(workdir / "runs", "setup_fails")
    script = (run / "job.sbatch").read_text()
    assert f"\n{FAILING}\nrc=$?;" in script and "--line 2" in script
    [stopped] = wait_event(run, events.Stopped, timeout=300)
    assert stopped.cls == FailureClass.setup_failed
    assert stopped.error == f"cluster.setup line 2 exited 2: {FAILING}"
    [submitted] = [e for e in ledger(run) if isinstance(e, events.Submitted)]
    wait_job_gone(str(submitted.job_id))
    rows = ledger(run)
    ended = [e for e in rows if isinstance(e, events.AttemptEnded)]
    assert [(e.cls, e.exit_code, e.before_started) for e in ended] == [
        (FailureClass.setup_failed, 2, True)
    ]
    assert not [e for e in rows if isinstance(e, (events.Started, events.Requeued))]
    assert len([e for e in rows if isinstance(e, events.Submitted)]) == 1
    status = run_cli(["status", str(run)], cwd=workdir)
    assert status.returncode == 0, status.stdout + status.stderr
    named = [line for line in status.stdout.splitlines() if "cluster.setup line 2" in line]
    assert len(named) == 1 and "setup_failed" in status.stdout, status.stdout
