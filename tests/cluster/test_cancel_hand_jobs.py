"""`cli cancel` and jobs submitted by hand (`sbatch RUN_DIR/job.sbatch`, a documented path), on the
real cluster: every job bearing the run's tag is found and cancelled, pending
and held included; a job the cancel could not find (no tag) does not train when it starts later;
a hand `sbatch job.sbatch` after the cancel is a user submission and trains."""

from __future__ import annotations

import re
import subprocess

import pytest

from slurmtrain.common.events import (
    AttemptEnded,
    Cancelled,
    CheckpointSaved,
    FailureClass,
    Finished,
    Paused,
    Rows,
    Started,
    Submitted,
)
from slurmtrain.login.slurm_submit import run_tag
from tests.cluster.helpers import events, only_run, wait_event, wait_job_gone, wait_until
from tests.conftest import run_cli, slurmtrain_env

pytestmark = pytest.mark.slurm
BASE = ["cluster=slurm", "nodes=1", "train.log_interval=1", "checkpoint.interval_steps=4"]


def _submit(workdir, name: str, args: list[str], inject: str = ""):
    env = {"SLURMTRAIN_INJECT": inject} if inject else None
    opt_in = ["faults.allow_inject=true"] if inject else []
    done = run_cli(BASE + [f"name={name}", *args, *opt_in], cwd=workdir, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return only_run(workdir / "runs", name)


def _hand_sbatch(run, *flags: str) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", *flags, str(run / "job.sbatch")],
        env=slurmtrain_env(),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def _state(job: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()


def _comment(job: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%k"], capture_output=True, text=True
    ).stdout.strip()


def _cancel(run) -> subprocess.CompletedProcess:
    done = run_cli(["cancel", str(run)], cwd=run, module="slurmtrain.cli")
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _cancelled(done: subprocess.CompletedProcess) -> set[str]:
    """The job ids of "cancelled job(s) 5, 7 of RUN" (whole ids: "7" is not in "17" or a path)."""
    found = re.search(r"cancelled job\(s\) ([\d, ]+) of ", done.stdout)
    return set(found.group(1).replace(",", " ").split()) if found else set()


def _after_cancel(run) -> Rows:
    rows = events(run)
    at = max(i for i, e in enumerate(rows) if isinstance(e, Cancelled))
    return rows[at + 1 :]


def test_cancel_finds_hand_submitted_jobs_pending_and_held(slurm_cluster, workdir):
    run = _submit(workdir, "cancelhand", ["train.max_steps=200"], inject="step_delay=0.5")
    [first] = [str(e.job_id) for e in events(run) if isinstance(e, Submitted)]
    # sbatch() puts its retry token beside the tag, not in place of it (common/slurm_cmd.py)
    assert run_tag(run) in _comment(first).split(), _comment(first)
    held = _hand_sbatch(run, "--hold")
    later = _hand_sbatch(run, "--begin=now+3600")  # pending, not held
    try:
        done = _cancel(run)
        for job in (first, held, later):
            assert job in _cancelled(done), done.stdout
            assert _state(job) == "", job  # gone from the queue, pending and held too
        [row] = [e for e in events(run) if isinstance(e, Cancelled)]
        assert {held, later} <= {str(j) for j in row.job_ids}
        assert not any(isinstance(e, (Started, Submitted)) for e in _after_cancel(run))
    finally:
        subprocess.run(["scancel", first, held, later], capture_output=True)


def test_a_hand_job_the_cancel_missed_does_not_train_and_one_after_it_does(slurm_cluster, workdir):
    run = _submit(workdir, "cancellegacy", ["train.max_steps=8"])
    # --comment replaces the tag: a job.sbatch written before tags existed, which cancel cannot see
    legacy = _hand_sbatch(run, "--hold", "--comment=untagged")
    jobs = [legacy]
    try:
        done = _cancel(run)
        assert legacy not in _cancelled(done) and _state(legacy) == "PENDING", done.stdout
        subprocess.run(["scontrol", "release", legacy], check=True, capture_output=True)
        wait_job_gone(legacy, timeout=600)  # it started, saw the cancel and left
        after = _after_cancel(run)
        assert not any(isinstance(e, (Started, Submitted, CheckpointSaved)) for e in after)
        [ended] = [e for e in after if e.job_id == legacy]  # nothing else of it
        assert isinstance(ended, AttemptEnded) and ended.cls == FailureClass.cancelled, ended
        assert ended.closed_by == "start"

        # A hand `sbatch job.sbatch` after the cancel is the user's: it lifts the cancel, trains.
        again = _hand_sbatch(run)
        jobs.append(again)
        wait_event(run, Finished, timeout=600)
        hand = [e for e in _after_cancel(run) if isinstance(e, Submitted)]
        assert [(str(e.job_id), e.by) for e in hand] == [(again, "hand")]
        wait_until(lambda: _state(again) == "", 120, "the hand job to leave the queue")
    finally:
        subprocess.run(["scancel", *jobs], capture_output=True)


def test_a_hand_sbatch_from_a_drill_shell_does_not_inherit_injection(slurm_cluster, workdir):
    """SLURMTRAIN_INJECT in the shell of a hand `sbatch job.sbatch` does not
    reach a run that never opted in (the script unsets it): no crash is injected."""
    run = _submit(workdir, "noinherit", ["train.max_steps=6", "train.pause_at_step=2"])
    wait_event(run, Paused, timeout=600)
    wait_job_gone(str(events(run)[0].job_id), timeout=300)
    out = subprocess.run(
        ["sbatch", "--parsable", str(run / "job.sbatch")],
        env=slurmtrain_env({"SLURMTRAIN_INJECT": "crash_at_step=4"}),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    try:
        wait_event(run, Finished, timeout=600)  # a `failed` row (the crash) fails at once
    finally:
        subprocess.run(["scancel", job], capture_output=True)
