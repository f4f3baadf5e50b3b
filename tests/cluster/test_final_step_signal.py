"""Slurm's time-limit warning during the run's final step finishes the run in that job: the
attempt does not ask to be requeued, so no extra job starts only to load the final checkpoint and
record `finished`."""

from __future__ import annotations

import subprocess
import time

import pytest

from slurmtrain.common.events import Finished, Requeued, Signal, Started, Submitted
from tests.cluster.helpers import events, submit_run, wait_event, wait_job_gone, wait_until
from tests.conftest import read_jsonl

pytestmark = pytest.mark.slurm
MAX = 15
BASE = ["cluster=slurm", "nodes=1", "train.log_interval=1", f"train.max_steps={MAX}"]
BASE += ["checkpoint.interval_steps=1000"]


def test_time_limit_signal_in_the_final_step_finishes_without_another_job(slurm_cluster, workdir):
    run = submit_run(BASE, workdir, "finalsig", [], inject="step_delay=3")

    def near_end() -> bool:
        path = run / "metrics.jsonl"
        return path.exists() and any(r["step"] >= MAX - 1 for r in read_jsonl(path))

    wait_until(near_end, 400, f"step {MAX - 1}", poll=0.2)
    [started] = [e for e in events(run) if isinstance(e, Started)]
    job = str(started.job_id)
    # What --signal=USR2@lead does at the time limit: every process of the job's steps.
    subprocess.run(["scancel", "--signal=USR2", job], check=True, capture_output=True)
    wait_event(run, Finished, timeout=300)
    wait_job_gone(job, timeout=180)
    time.sleep(5)  # a requeue or resubmission would have been recorded by now
    kinds = [type(e) for e in events(run)]
    [sig] = [e for e in events(run) if isinstance(e, Signal)]
    assert sig.signal == "SIGUSR2" and sig.step == MAX
    assert kinds.count(Started) == 1 and Requeued not in kinds, kinds
    assert kinds.count(Submitted) == 1, kinds
