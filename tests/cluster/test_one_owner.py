"""One run, one job; the batch shell survives SIGTERM, on real Slurm.

A second job of a running run refuses and exits untouched; two shells submitting the same config at
once queue one job; a stopped run resubmitted by hand resumes; SIGTERM to the batch shell alone
neither kills the training nor skips the supervisor.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from slurmtrain.common.events import (
    AttemptEnded,
    CheckpointLoaded,
    CheckpointSaved,
    DuplicateRefused,
    FailureClass,
    Finished,
    Paused,
    Requeued,
    Resubmitting,
    Started,
    Stopped,
    Submitted,
)
from tests.cluster.helpers import (
    cancel_all_of,
    events,
    only_run,
    time_limit_soon,
    wait_event,
    wait_job_gone,
    wait_until,
)
from tests.conftest import read_jsonl, run_cli, slurmtrain_env

pytestmark = pytest.mark.slurm
BASE = ["cluster=slurm", "train.log_interval=1", "checkpoint.interval_steps=5", "nodes=1"]


def submit(workdir, name, args, inject=""):
    env = {"SLURMTRAIN_INJECT": inject} if inject else None
    opt_in = ["faults.allow_inject=true"] if inject else []  # job.sbatch then keeps it
    done = run_cli(BASE + [f"name={name}"] + args + opt_in, cwd=workdir, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return only_run(workdir / "runs", name)


def steps(run):
    return [(r["attempt"], r["step"]) for r in read_jsonl(run / "metrics.jsonl")]


def trained_to(run, step):
    return lambda: (run / "metrics.jsonl").exists() and any(s >= step for _, s in steps(run))


def hand_sbatch(run, inject=""):
    env = slurmtrain_env({"SLURMTRAIN_INJECT": inject} if inject else None)
    out = subprocess.run(
        ["sbatch", "--parsable", str(run / "job.sbatch")], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def test_a_second_job_of_a_running_run_refuses_and_the_first_finishes_untouched(
    slurm_cluster, workdir
):
    run = submit(workdir, "dup", ["train.max_steps=40"], inject="step_delay=0.5")
    wait_until(trained_to(run, 3), 300, "training to start")
    second = hand_sbatch(run, inject="step_delay=0.5")
    [refused] = wait_event(run, DuplicateRefused, timeout=300)
    first = [e for e in events(run) if isinstance(e, Started)][0].job_id
    assert refused.job_id == second and refused.owner == first
    wait_event(run, Finished, timeout=400)
    wait_job_gone(second)
    ev = events(run)
    assert [e.job_id for e in ev if isinstance(e, Started)] == [first]
    assert steps(run) == [(1, s) for s in range(1, 41)]  # one trainer, every step once
    saves = [e for e in ev if isinstance(e, CheckpointSaved)]
    assert {e.job_id for e in saves} == {first}
    assert [e.step for e in saves] == [5, 10, 15, 20, 25, 30, 35, 40]
    assert not any(isinstance(e, (Stopped, Requeued, Resubmitting)) for e in ev)
    log = (run / "logs" / f"{second}.batch.out").read_text()
    assert "another job holds it" in log


def test_two_shells_submitting_the_same_config_at_once_queue_one_job(slurm_cluster, workdir):
    args = BASE + ["name=race", "train.max_steps=10"]
    results = []

    def go():
        results.append(run_cli(args, cwd=workdir))

    shells = [threading.Thread(target=go) for _ in range(2)]
    for t in shells:
        t.start()
    for t in shells:
        t.join()
    run = only_run(workdir / "runs", "race")
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    said = "".join(r.stdout for r in results)
    assert said.count("submitted job") == 1 and "already queued or running" in said
    wait_event(run, Finished, timeout=300)
    assert sum(isinstance(e, Submitted) for e in events(run)) == 1
    assert sum(isinstance(e, Started) for e in events(run)) == 1


def test_a_stopped_run_resubmitted_by_hand_resumes(slurm_cluster, workdir):
    run = submit(workdir, "byhand", ["train.max_steps=12", "train.pause_at_step=5"])
    wait_event(run, Paused, timeout=300)
    job = [e for e in events(run) if isinstance(e, Started)][0].job_id
    wait_job_gone(job)
    hand_sbatch(run)
    wait_event(run, Finished, timeout=300)
    ev = events(run)
    assert not any(isinstance(e, DuplicateRefused) for e in ev)
    assert [e.step for e in ev if isinstance(e, CheckpointLoaded)] == [5]
    assert [s for _, s in steps(run)] == list(range(1, 13))


def _batch_shell_pid(job_id):
    out = subprocess.run(
        ["scontrol", "listpids", job_id], capture_output=True, text=True, check=True
    ).stdout
    for line in out.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "batch":
            try:
                cmd = open(f"/proc/{parts[0]}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if any(c.endswith(b"slurm_script") for c in cmd):
                return int(parts[0])
    raise AssertionError(f"no batch shell for job {job_id} in:\n{out}")


def test_sigterm_to_the_batch_shell_does_not_end_the_run(slurm_cluster, workdir):
    run = submit(workdir, "termshell", ["train.max_steps=25"], inject="step_delay=0.5")
    wait_until(trained_to(run, 3), 300, "training to start")
    [sub] = [e for e in events(run) if isinstance(e, Submitted)]
    os.kill(_batch_shell_pid(str(sub.job_id)), signal.SIGTERM)
    wait_event(run, Finished, timeout=300)
    assert [s for _, s in steps(run)] == list(range(1, 26))
    time.sleep(2)
    log = (run / "logs" / f"{sub.job_id}.batch.out").read_text()
    assert "batch shell got SIGTERM" in log


def test_a_time_limit_that_strikes_mid_save_still_restarts_the_run(slurm_cluster, workdir):
    # The save (shard_delay) outlasts the signal lead: Slurm's time-limit SIGTERM and, KillWait
    # (15 s) later, SIGKILL end ranks and batch shell mid-save. The batch shell's trap restarts.
    # The first job's limit is cut to 1 min once it trains (the resubmitted job gets --time=3).
    run = submit(
        workdir,
        "overrun",
        [
            "cluster.time=3",
            "cluster.signal_lead_s=30",
            "train.max_steps=400",
            "checkpoint.interval_steps=1000",
            "faults.health_check=false",
        ],
        inject="step_delay=0.3,shard_delay=40,attempts=1",
    )
    try:
        time_limit_soon(run)  # 1 min once it trains; 2 when its start was slow (a loaded host)
        starts = wait_event(run, Started, count=2, timeout=400, fail_on=())
        ev = events(run)
        [end] = [e for e in ev if isinstance(e, AttemptEnded) and e.attempt == 1]
        assert end.cls == FailureClass.timed_out
        [sub] = [e for e in ev if isinstance(e, Submitted) and e.requeue_of]
        assert starts[1].job_id == sub.job_id != starts[0].job_id
        kinds = [type(e) for e in ev]
        assert kinds.index(Resubmitting) < kinds.index(Submitted, kinds.index(Resubmitting))
        assert not any(isinstance(e, DuplicateRefused) for e in ev)
        # a scancel's SIGTERM is not the time limit's: the trap must not restart a cancelled run
        subprocess.run(["scancel", str(sub.job_id)], check=True)
        wait_job_gone(str(sub.job_id))
        time.sleep(5)
        subs = [e for e in events(run) if isinstance(e, Submitted)]
        assert subs[-1].job_id == sub.job_id, subs
    finally:
        cancel_all_of("overrun")
