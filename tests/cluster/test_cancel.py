"""`python -m slurmtrain.cli cancel` on the real cluster: a running run stops, nothing restarts it,
and submitting the same config again resumes from its checkpoint."""

from __future__ import annotations

import time

import pytest

from slurmtrain.common import checkpoint_format
from slurmtrain.common.events import (
    Cancelled,
    CheckpointLoaded,
    CheckpointSaved,
    Finished,
    Requeued,
    Started,
    Submitted,
    SuccessorQueued,
)
from slurmtrain.common.rundir import STOPPED, RunDir
from tests.cluster.helpers import events, jobs_named, only_run, wait_event, wait_until
from tests.conftest import run_cli

pytestmark = pytest.mark.slurm
ARGS = [
    "cluster=slurm",
    "nodes=2",
    "name=cancelme",
    "train.max_steps=60",
    "train.log_interval=1",
    "checkpoint.interval_steps=5",
]


def _queued(name: str) -> list[str]:
    return jobs_named(name)  # the run's own job name since its successor (issue 38)


def test_cancel_stops_a_running_run_for_good_and_keeps_it_resumable(slurm_cluster, workdir):
    inject = {"SLURMTRAIN_INJECT": "step_delay=1.0"}
    done = run_cli([*ARGS, "faults.allow_inject=true"], cwd=workdir, env=inject)
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run(workdir / "runs", "cancelme")
    wait_event(run, CheckpointSaved, timeout=300)
    [submitted] = [e for e in events(run) if isinstance(e, Submitted)]

    t0 = time.time()
    cancelled = run_cli(["cancel", "cancelme"], cwd=workdir, module="slurmtrain.cli")  # by name
    took = time.time() - t0
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    # the run's job and its queued successor (issue 38), in one line
    [listed] = [line for line in cancelled.stdout.splitlines() if "cancelled job(s)" in line]
    successors = [e.new_job_id for e in events(run) if isinstance(e, SuccessorQueued)]
    assert {submitted.job_id, *successors} <= set(listed.replace(",", " ").split()), listed
    assert "checkpoints kept" in cancelled.stdout
    assert not _queued("cancelme")  # cancel waits until the jobs have left the queue

    # Nothing restarts it: no new job, attempt or requeue in the next 10 s (the batch shell, where
    # a restart would come from, has left the queue: a requeued job would be in it again).
    time.sleep(10)
    rows = events(run)
    at = next(i for i, e in enumerate(rows) if isinstance(e, Cancelled))
    after = [e.event for e in rows[at + 1 :]]
    assert not any(isinstance(e, (Submitted, Requeued, Started)) for e in rows[at + 1 :]), after
    assert not _queued("cancelme")
    assert not any(isinstance(e, Finished) for e in rows[at + 1 :]), after
    assert RunDir(run).state() == STOPPED
    resume = checkpoint_format.find_resumable(run / "checkpoints")
    assert resume.path is not None
    print(
        f"cancel took {took:.1f} s; events after it: {after}; newest checkpoint {resume.path.name}"
    )

    # Resumable: the same config again continues from that checkpoint and finishes.
    again = run_cli(ARGS, cwd=workdir)
    assert again.returncode == 0 and "resuming" in again.stdout, again.stdout + again.stderr
    wait_event(run, Finished, timeout=400)
    loaded = [e for e in events(run) if isinstance(e, CheckpointLoaded)]
    assert loaded and loaded[-1].step == resume.manifest["step"]
    wait_until(lambda: not _queued("cancelme"), 120, "the resumed job to leave the queue")
