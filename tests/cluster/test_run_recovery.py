"""Recovery on the real local cluster: a stopped run resumes when the user
resubmits it, and neither a held successor nor a supervisor exception wedges a run."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from slurmtrain.common.events import (
    AttemptEnded,
    BudgetWindow,
    FailureClass,
    Finished,
    Paused,
    ReleaseFailed,
    Requeued,
    Started,
    Stopped,
    Submitted,
    SupervisorFailed,
)
from slurmtrain.common.rundir import RunDir
from tests.cluster.helpers import events, submit_run, wait_event, wait_job_gone, wait_until
from tests.conftest import run_cli

pytestmark = pytest.mark.slurm
BASE = [
    "cluster=slurm",
    "nodes=1",
    "cluster.cpu_tasks_per_node=1",
    "train.log_interval=1",
    "train.max_steps=10",
    "checkpoint.interval_steps=5",
]


def queued(job: str) -> str:
    """`STATE|REASON` of the job while squeue shows it, else ''."""
    done = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T|%r"], capture_output=True, text=True
    )
    return done.stdout.strip()


def wait_finished(run, timeout: float = 600, stops: int = 0, idle_s: float = 90) -> None:
    """Until the run finishes; fails at once when it stops (again: more than `stops` rows), and
    when none of its jobs has been in the queue for `idle_s` (nobody will restart it)."""
    idle_since = [time.time()]

    def check() -> bool:
        rows = events(run)
        kinds = [type(e) for e in rows]
        assert kinds.count(Stopped) <= stops, f"stopped: {rows[-1]}"
        if Finished in kinds:
            return True
        jobs = {str(e.job_id) for e in rows if isinstance(e, (Submitted, Started))}
        jobs |= {str(e.new_job_id) for e in rows if isinstance(e, Requeued)}
        if any(queued(j) for j in jobs):
            idle_since[0] = time.time()
        assert time.time() - idle_since[0] < idle_s, (
            f"no job of the run queued: {[e.event for e in rows[-5:]]}"
        )
        return False

    wait_until(check, timeout, f"{run} to finish", poll=2)


def status_row(run, workdir, env=None) -> dict:
    done = run_cli(["status", "--json", str(run)], cwd=workdir, module="slurmtrain.cli", env=env)
    return json.loads(done.stdout.splitlines()[0])


def test_a_run_stopped_by_a_crash_loop_finishes_when_the_user_resubmits_the_same_command(
    slurm_cluster, workdir
):
    run = submit_run(BASE, workdir, "window", [], inject="crash_at_step=7")
    stop = wait_event(run, Stopped, timeout=600, fail_on=())[-1]
    assert stop.cls == "crash loop"
    wait_job_gone(str(stop.job_id))
    # The user "fixes" the cause (no injected crash) and runs the same command again.
    again = run_cli([*BASE, "name=window"], cwd=workdir)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming unfinished run" in again.stdout
    assert "count again from this submission" in again.stdout
    wait_finished(run, stops=1)  # the old window's stop only
    [opened] = [e for e in events(run) if isinstance(e, BudgetWindow)]
    assert opened.after_class == "crash loop" and opened.window == 2
    row = status_row(run, workdir)
    assert row["state"] == "finished" and row["window"] == 2


def test_a_held_successor_left_by_a_dead_supervisor_is_released_and_the_run_finishes(
    slurm_cluster, workdir
):
    run = submit_run(BASE, workdir, "heldowner", ["train.pause_at_step=5"])
    paused = wait_event(run, Paused, timeout=600)[-1]
    wait_job_gone(str(paused.job_id))
    # What a supervisor killed between recording its successor and releasing it leaves behind.
    held = subprocess.run(
        ["sbatch", "--parsable", "--hold", str(run / "job.sbatch")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    RunDir(run).record(
        Submitted(executor="slurm", fingerprint=run.name, requeue_of=str(paused.job_id)),
        job_id=held,
    )
    time.sleep(6)
    assert queued(held) == "PENDING|JobHeldUser"
    row = status_row(run, workdir, env={"SLURMTRAIN_HELD_OWNER_S": "5"})
    assert row["state"] == "running"
    # released by the liveness check that status made, not left held
    assert not queued(held).endswith("JobHeldUser"), queued(held)
    wait_finished(run)
    assert [e.job_id for e in events(run) if isinstance(e, Started)][-1] == held


def test_a_supervisor_exception_is_recorded_and_the_run_still_finishes(slurm_cluster, workdir):
    inject = "crash_at_step=7,attempts=1,supervisor_raise=1"
    run = submit_run(BASE, workdir, "supfail", [], inject=inject)
    wait_event(run, Started, timeout=600, fail_on=())
    # A damaged run directory no longer knocks the supervisor over (a directory where the
    # bad-node ledger goes is skipped and counted, issue 37); the drill's raise does, once.
    (run / "bad_nodes.jsonl").mkdir()
    wait_finished(run, timeout=900)
    [failed] = [e for e in events(run) if isinstance(e, SupervisorFailed)]
    assert "injected supervisor failure" in failed.error
    ended = [e for e in events(run) if isinstance(e, AttemptEnded)]
    assert [e.cls for e in ended] == [FailureClass.crash]
    wait_until(lambda: status_row(run, workdir)["state"] == "finished", 60, "status finished")


def test_release_lifts_a_real_hold_and_checks_that_it_is_gone(slurm_cluster, tmp_path):
    from slurmtrain.batch import next_job
    from slurmtrain.common.liveness import held

    job = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-p", "debug", "-t", "1", "-o", "/dev/null"]
        + ["--job-name=st-held-probe", "--wrap", "true"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    run = RunDir(tmp_path / "run")
    run.ledger_dir.mkdir(parents=True)
    try:
        assert held(job) is True
        assert next_job.release(run, job, {"job_id": "1", "attempt": 1}) is True
        assert held(job) is False
        assert not [e for e in run.run_events() if isinstance(e, ReleaseFailed)]
    finally:
        subprocess.run(["scancel", job], capture_output=True)
