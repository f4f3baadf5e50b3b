"""Recovery gaps on the real cluster: exclusions leave room for the spares, and a SIGTERM
during the in-allocation relaunch decision still leaves a successor or a recorded class."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.batch import exclusions
from slurmtrain.common import schema
from slurmtrain.common.events import (
    AttemptEnded,
    FailureClass,
    Finished,
    RelaunchAbandoned,
    Requeued,
    Started,
    Submitted,
)
from slurmtrain.common.rundir import RunDir
from tests.cluster.helpers import events, submit_run, wait_until

pytestmark = pytest.mark.slurm
schema.register()


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        return compose("config", overrides=["cluster=slurm", "gpus_per_node=0", *overrides])


def test_exclusions_leave_the_partition_room_for_the_spares(slurm_cluster, tmp_path):
    """debug holds n1-n4; nodes=2 with one spare asks Slurm for 3. Two failed nodes (once each):
    excluding both left 2 nodes for a 3-node job, which then pended forever."""
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    now = time.time()
    rows = [
        {"node": n, "reason": "health", "time": now - i, "job_id": str(i)}
        for i, n in enumerate(["n1", "n2"])
    ]
    run.bad_nodes.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _cfg("nodes=2", "faults.spare_nodes=1", "cluster.partition=debug")
    got = exclusions.plan(run, cfg, now)
    assert got.nodes == ["n1"] and got.dropped == ["n2"] and got.problem is None
    no_spares = exclusions.plan(run, _cfg("nodes=2", "cluster.partition=debug"), now)
    assert no_spares.nodes == ["n1", "n2"]
    user = exclusions.plan(
        run,
        _cfg(
            "nodes=2", "faults.spare_nodes=1", "cluster.partition=debug", "cluster.exclude='n[3-4]'"
        ),
        now,
    )
    assert (
        user.problem and "nodes+faults.spare_nodes=3 but the partition has 4 nodes" in user.problem
    )


BASE = ["cluster=slurm", "train.log_interval=1", "faults.health_check=false"]


def test_sigterm_during_the_relaunch_decision_leaves_a_successor(slurm_cluster, workdir):
    """A crash with a spare: the supervisor chooses the next step's nodes inside the job, and the
    time limit's SIGTERM lands while it does (relaunch_delay holds the decision until the TERM).
    A shell that dropped the relaunch on the TERM would strand the run: the ledger saying
    `restarted_in_allocation`, no step running, no job queued."""
    run = submit_run(
        BASE,
        workdir,
        "termrace",
        ["nodes=1", "faults.spare_nodes=1", "train.max_steps=12", "checkpoint.interval_steps=4"],
        inject="crash_at_step=6,attempts=1,relaunch_delay=150",
    )

    def ended():
        return [e for e in events(run) if isinstance(e, AttemptEnded) and e.attempt == 1]

    wait_until(lambda: bool(ended()), 400, "attempt 1 ended (the crash)")
    [first] = ended()
    assert first.cls == FailureClass.crash
    job = first.job_id
    # The time limit, now: Slurm TERMs the batch step within its 30 s timeout check.
    done = subprocess.run(
        ["scontrol", "update", f"JobId={job}", "TimeLimit=1"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    wait_until(
        lambda: any(isinstance(e, Finished) for e in events(run)), 600, "the successor finished"
    )
    ev = events(run)
    [abandoned] = [e for e in ev if isinstance(e, RelaunchAbandoned)]
    assert abandoned.cls == FailureClass.timed_out and abandoned.reason == FailureClass.crash
    [queued] = [e for e in ev if isinstance(e, Requeued)]
    assert queued.how == "resubmit" and queued.new_job_id != job
    started = [e for e in ev if isinstance(e, Started)]
    assert [e.job_id for e in started] == [job, queued.new_job_id]  # no step in the dying job


def test_a_scancel_during_the_relaunch_decision_is_recorded_and_nothing_restarts(
    slurm_cluster, workdir
):
    """The same race with a user's scancel: no step starts in the cancelled job, nothing is
    queued, and the ledger says so (`relaunch_abandoned`, class cancelled)."""
    run = submit_run(
        BASE,
        workdir,
        "termcancel",
        ["nodes=1", "faults.spare_nodes=1", "train.max_steps=12", "checkpoint.interval_steps=4"],
        inject="crash_at_step=6,attempts=1,relaunch_delay=150",
    )

    def rows(kind):
        return [e for e in events(run) if isinstance(e, kind)]

    wait_until(lambda: bool(rows(AttemptEnded)), 400, "attempt 1 ended (the crash)")
    job = rows(AttemptEnded)[0].job_id
    assert subprocess.run(["scancel", job]).returncode == 0
    wait_until(lambda: bool(rows(RelaunchAbandoned)), 120, "the abandoned relaunch recorded")
    [abandoned] = rows(RelaunchAbandoned)
    assert abandoned.cls == FailureClass.cancelled and abandoned.reason == FailureClass.crash
    time.sleep(20)  # past KillWait: whatever the job was going to do, it has done
    assert not rows(Requeued) and not rows(Submitted)[1:]
    assert [e.job_id for e in rows(Started)] == [job]
