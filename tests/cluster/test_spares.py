"""Hot spares: after a failure the next attempt starts inside the same allocation, on healthy nodes.

The job holds nodes + faults.spare_nodes with --no-kill; a node's death (its slurmd and its rank
killed) or a hang restarts the run in the same job id, with a spare in the failed node's place and
the same world size, without a trip through Slurm's queue. A `nodes` range with no spare shrinks in
place.
"""

from __future__ import annotations

import subprocess

import pytest

from slurmtrain.common.events import (
    AttemptEnded,
    CheckpointLoaded,
    FailureClass,
    Finished,
    Requeued,
    RestartedInAllocation,
    Started,
    Submitted,
)
from tests.cluster.helpers import (
    events,
    node_killed,
    steps_by_attempt,
    submit_run,
    wait_event,
    wait_until,
)
from tests.conftest import read_jsonl, run_cli

pytestmark = pytest.mark.slurm
BASE = [
    "cluster=slurm",
    "train.log_interval=1",
    "train.max_steps=30",
    "checkpoint.interval_steps=5",
    "faults.health_check=false",
]


def submit(workdir, name, args, inject=""):
    return submit_run(BASE, workdir, name, args, inject)


def wait_step(run, step):
    wait_until(
        lambda: (
            (run / "metrics.jsonl").exists()
            and max(r["step"] for r in read_jsonl(run / "metrics.jsonl")) >= step
        ),
        300,
        f"step {step}",
    )


def one_job(ev):
    submitted = [e for e in ev if isinstance(e, Submitted)]
    started = [e for e in ev if isinstance(e, Started)]
    assert len(submitted) == 1 and {e.job_id for e in started} == {submitted[0].job_id}
    return started


def test_node_failure_with_a_spare_restarts_inside_the_job(slurm_cluster, workdir):
    run = submit(
        workdir,
        "spare",
        ["nodes=2", "faults.spare_nodes=1", "train.max_steps=40"],
        inject="step_delay=0.5",
    )
    wait_step(run, 12)
    first = [e for e in events(run) if isinstance(e, Started)][0]
    with node_killed(slurm_cluster, first, 1) as victim:  # the batch shell is on rank 0's node
        wait_event(run, Finished, timeout=300, fail_on=())
    ev = events(run)
    started = one_job(ev)
    assert len(started) == 2 and started[1].world_size == started[0].world_size == 2
    assert victim not in started[1].hosts
    [moved] = [e for e in ev if isinstance(e, RestartedInAllocation)]
    assert moved.left_out == (victim,) and moved.reason == FailureClass.node_failure
    assert len(moved.swapped_in) == 1 and moved.swapped_in[0] in started[1].hosts
    [end] = [e for e in ev if isinstance(e, AttemptEnded) and e.attempt == 1]
    assert end.cls == FailureClass.node_failure
    loaded = [e for e in ev if isinstance(e, CheckpointLoaded)][-1]
    lost = max(steps_by_attempt(run)[1]) - loaded.step
    assert lost <= 5  # at most one checkpoint interval lost
    assert not any(isinstance(e, Requeued) for e in ev)
    status = run_cli(["status", "--json", str(run)], cwd=workdir, module="slurmtrain.cli")
    assert '"spares": {"held": 1, "idle": 0, "used": 1, "lost": 1}' in status.stdout


def test_hang_with_a_spare_restarts_inside_the_job(slurm_cluster, workdir):
    run = submit(
        workdir,
        "sparehang",
        ["nodes=2", "faults.spare_nodes=1", "faults.hang_timeout_s=15", "train.max_steps=20"],
        inject="stall_at_step=8,stall_rank=1,attempts=1",
    )
    wait_event(run, Finished, timeout=400, fail_on=())
    ev = events(run)
    started = one_job(ev)  # every attempt in the one job (a loaded machine may hang twice)
    assert len(started) >= 2 and {e.world_size for e in started} == {2}
    [end] = [e for e in ev if isinstance(e, AttemptEnded) and e.attempt == 1]
    assert end.cls == FailureClass.hang
    moved = [e for e in ev if isinstance(e, RestartedInAllocation)]
    assert len(moved) == len(started) - 1 and {e.reason for e in moved} == {FailureClass.hang}


def idle_nodes(names):
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-n", ",".join(names), "-t", "idle", "-o", "%N"],
        capture_output=True,
        text=True,
    ).stdout.split()
    return set(out)


def test_a_range_with_no_spare_shrinks_in_place(slurm_cluster, workdir):
    # Slurm gives a range as many nodes as are free at once: wait for the three to be idle.
    wait_until(lambda: idle_nodes(["n1", "n2", "n3"]) == {"n1", "n2", "n3"}, 120, "3 idle nodes")
    run = submit(
        workdir,
        "shrinkinplace",
        [
            "nodes=2-3",
            "train.micro_batch_size=2",
            "train.global_batch_size=12",
            "train.max_steps=40",
            "cluster.exclude=n4",
        ],
        inject="step_delay=0.5",
    )
    wait_step(run, 12)
    first = [e for e in events(run) if isinstance(e, Started)][0]
    assert first.world_size == 3
    with node_killed(slurm_cluster, first, 2) as victim:
        wait_event(run, Finished, timeout=300, fail_on=())
    ev = events(run)
    started = one_job(ev)
    assert started[-1].world_size == 2 and victim not in started[-1].hosts
    [moved] = [e for e in ev if isinstance(e, RestartedInAllocation)]
    assert moved.left_out == (victim,) and moved.swapped_in == ()
