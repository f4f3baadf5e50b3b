"""The successor already in the queue (issue 38, build 3), on real Slurm: a run's pending
`--dependency=singleton` copy of job.sbatch takes over when the batch node dies, with no human
action; once the run finishes, nothing of it is left in the queue; a scancel whose save outlasts
KillWait leaves the successor untrained."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from slurmtrain.common.events import (
    Cancelled,
    CheckpointLoaded,
    CheckpointSaved,
    Finished,
    Started,
    SuccessorCancelled,
    SuccessorQueued,
)
from tests.cluster.helpers import (
    events,
    job_pids,
    queued_of,
    rows_of,
    submit_run,
    wait_event,
    wait_until,
)

pytestmark = pytest.mark.slurm
BASE = [
    "cluster=slurm",
    "nodes=1",
    "train.log_interval=1",
    "checkpoint.interval_steps=4",  # faults.successor: on by default for a single Slurm run
]


def test_a_scancel_that_outlasts_kill_wait_leaves_the_successor_untrained(slurm_cluster, workdir):
    # The SIGTERM's save (shard_delay) outlasts KillWait (15 s): SIGKILL ends the batch shell
    # before its supervisor and its end's settle, so the successor starts: it asks Slurm, finds
    # the job CANCELLED (not preempted), and trains nothing.
    run = submit_run(
        BASE[:-1],
        workdir,
        "succscan",
        ["train.max_steps=400", "checkpoint.interval_steps=1000"],
        inject="step_delay=0.3,shard_delay=40",
    )
    [started] = wait_event(run, Started, timeout=300)
    [queued] = rows_of(run, SuccessorQueued)
    subprocess.run(["scancel", str(started.job_id)], check=True)
    [late] = wait_event(run, SuccessorCancelled, timeout=180, fail_on=())
    assert late.new_job_ids == (queued.new_job_id,) and late.reason == Cancelled.kind
    wait_until(lambda: not queued_of("succscan", run), 60, "the run's jobs to leave the queue")
    assert [e.job_id for e in rows_of(run, Started)] == [started.job_id]


def test_the_successor_takes_over_when_the_batch_node_dies(slurm_cluster, workdir):
    # One run for both points (CI's budget): the batch node's death, then the finish's cleanup.
    run = submit_run(BASE, workdir, "succkill", ["train.max_steps=16"], inject="step_delay=0.5")
    wait_event(run, CheckpointSaved, timeout=300)
    [started] = rows_of(run, Started)
    [queued] = rows_of(run, SuccessorQueued)
    victim = started.hosts[0]  # nodes=1: the batch node itself
    # Slurm would requeue the job itself (--requeue; the successor then waits behind it): a site
    # without requeue, or a job past MaxBatchRequeue, is the case the successor is for.
    subprocess.run(["scontrol", "update", f"jobid={started.job_id}", "requeue=0"], check=True)
    pids = job_pids(str(started.job_id))
    assert started.pids[0] in pids, pids
    os.kill(slurm_cluster.slurmd_pid(victim), signal.SIGKILL)  # the node dies: slurmd and ...
    for pid in pids:  # ... everything of the job on it (one host here: killed by hand)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        wait_event(run, Finished, timeout=500, fail_on=())
    finally:
        slurm_cluster.start()
        subprocess.run(
            ["scontrol", "update", f"nodename={victim}", "state=resume"], capture_output=True
        )
    ev = events(run)
    starts = [e for e in ev if isinstance(e, Started)]
    takers = {str(e.job_id) for e in starts[1:]}
    print(f"first job {started.job_id}, successor {queued.new_job_id}, trained by {takers}")
    assert queued.new_job_id in takers  # no human action: the queued successor resumed it
    loaded = [e for e in ev if isinstance(e, CheckpointLoaded)]
    assert str(queued.new_job_id) in {str(e.job_id) for e in loaded}  # resumed, not restarted
    # The finish: the successor's own pending successor is cancelled by its batch shell, and
    # nothing of the run is left in the queue.
    [*_, own] = rows_of(run, SuccessorQueued)
    cancelled = wait_event(run, SuccessorCancelled, timeout=60, fail_on=())[-1]
    assert cancelled.reason == Finished.kind and own.new_job_id in cancelled.new_job_ids
    wait_until(lambda: not queued_of("succkill", run), 60, "the run's jobs to leave the queue")
