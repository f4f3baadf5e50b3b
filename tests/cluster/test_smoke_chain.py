"""smoke=true on the real cluster: a 1-node smoke run (save at 10 in one job, load and finish in a
second) gates the big job through --dependency=afterok; a failed smoke means the big job never runs."""

from __future__ import annotations

import json

import pytest

from slurmtrain.common import slurm_cmd
from slurmtrain.common.events import (
    CheckpointLoaded,
    FailureClass,
    Finished,
    Paused,
    Started,
    Stopped,
    Submitted,
)
from tests.cluster.helpers import events, only_run, wait_event, wait_until
from tests.conftest import run_cli

pytestmark = pytest.mark.slurm
BASE = [
    "cluster=slurm",
    "nodes=2",
    "model.num_layers=3",
    "train.max_steps=20",
    "train.log_interval=5",
    "checkpoint.interval_steps=10",
    "smoke=true",
]


def submit(workdir, name, inject=""):
    env = {"SLURMTRAIN_INJECT": inject} if inject else None
    opt_in = ["faults.allow_inject=true"] if inject else []
    done = run_cli(BASE + [f"name={name}", *opt_in], cwd=workdir, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "smoke test first" in done.stdout
    return only_run(workdir / "runs", name), only_run(workdir / "runs", f"{name}-smoke")


def status(workdir, run):
    done = run_cli(["status", "--json", str(run)], cwd=workdir, module="slurmtrain.cli")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[0])


def submitted(run):
    return [e for e in events(run) if isinstance(e, Submitted)]


def test_failed_smoke_means_the_big_job_never_runs_and_status_says_why(slurm_cluster, workdir):
    # Both jobs inherit the injection; name_suffix confines it to the smoke run.
    big, smoke = submit(workdir, "smokefail", inject="crash_at_step=3,name_suffix=-smoke")
    [sub] = submitted(big)
    first, second = [e.job_id for e in submitted(smoke)]
    assert sub.smoke_job_id == second and sub.smoke_run == str(smoke)
    [stop] = wait_event(smoke, Stopped, timeout=300, fail_on=())
    assert stop.cls == FailureClass.crash and "injected crash at step 3" in stop.error
    # The supervisor exits non-zero when it stops a run: afterok is never met, Slurm cancels
    # the rest of the chain instead of leaving it pending forever.
    wait_until(lambda: slurm_cmd.job_state(first) == "FAILED", 120, f"smoke job {first} FAILED")
    wait_until(
        lambda: slurm_cmd.job_state(sub.job_id) == "CANCELLED",
        120,
        f"big job {sub.job_id} cancelled",
    )
    assert slurm_cmd.job_state(second) == "CANCELLED"
    assert not any(isinstance(e, Started) for e in events(big))
    row = status(workdir, big)
    assert row["state"] == "blocked: smoke failed", row
    assert "injected crash at step 3" in row["error"] and row["smoke_run"] == str(smoke)


def test_passing_smoke_saves_loads_then_the_big_job_runs_to_the_end(slurm_cluster, workdir):
    big, smoke = submit(workdir, "smokeok")
    [sub] = submitted(big)
    first, second = [e.job_id for e in submitted(smoke)]
    assert "--dependency" not in (big / "job.sbatch").read_text()  # resubmittable by hand
    [finished] = wait_event(big, Finished, timeout=400)
    assert finished.step == 20
    small = events(smoke)
    [paused] = [e for e in small if isinstance(e, Paused)]
    [loaded] = [e for e in small if isinstance(e, CheckpointLoaded)]
    [done] = [e for e in small if isinstance(e, Finished)]
    assert (paused.job_id, paused.step) == (first, 10)
    assert (loaded.job_id, loaded.step) == (second, 10)
    assert (done.job_id, done.step) == (second, 20)
    [started] = [e for e in events(big) if isinstance(e, Started)]
    assert started.job_id == sub.job_id and started.time > done.time
    assert len(set(started.hosts)) == 2
    assert {e.world_size for e in small if isinstance(e, Started)} == {1}
    assert "num_layers: 2" in (smoke / "config.yaml").read_text()
    assert status(workdir, big)["state"] == "finished"
