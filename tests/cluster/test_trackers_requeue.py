"""A run requeued twice at its time limit logs to ONE W&B run (offline) and ONE MLflow
run (file store), each with the step axis 1..max_steps, every step once, in order; read from the
trackers' own files. Slurm's time-limit warning is what `scancel --signal=USR2` sends (the
--signal=USR2@lead path, without waiting for a limit)."""

from __future__ import annotations

import subprocess

import pytest

from slurmtrain.common.events import Finished, Requeued, Signal, Started
from tests.cluster.helpers import events, submit_run, wait_event, wait_until
from tests.conftest import read_jsonl
from tests.tracker_files import mlflow_runs, mlflow_steps, wandb_offline

pytestmark = pytest.mark.slurm
MAX = 24
BASE = [
    "cluster=slurm",
    "nodes=1",
    "train.log_interval=1",
    f"train.max_steps={MAX}",
    "checkpoint.interval_steps=1000",
    "logger=[wandb,mlflow]",
]


def _time_limit_at(run, attempt: int, step: int) -> None:
    """Once `attempt` has logged `step`, its job gets the time-limit warning; wait for the requeue."""

    def reached() -> bool:
        path = run / "metrics.jsonl"
        rows = read_jsonl(path) if path.exists() else []
        return any(r["attempt"] == attempt and r["step"] >= step for r in rows)

    wait_until(reached, 400, f"attempt {attempt} at step {step}", poll=0.2)
    [job] = [str(e.job_id) for e in events(run) if isinstance(e, Started)][-1:]
    subprocess.run(["scancel", "--signal=USR2", job], check=True, capture_output=True)
    wait_event(run, Requeued, timeout=300, count=attempt)


def test_two_time_limit_requeues_log_to_one_wandb_and_one_mlflow_run(slurm_cluster, workdir):
    run = submit_run(BASE, workdir, "trackers", [], inject="step_delay=0.4")
    _time_limit_at(run, 1, 5)
    _time_limit_at(run, 2, 12)
    wait_event(run, Finished, timeout=400)
    ev = events(run)
    assert sum(isinstance(e, Started) for e in ev) == 3
    assert [e.signal for e in ev if isinstance(e, Signal)] == ["SIGUSR2", "SIGUSR2"]

    # W&B: one offline folder per attempt, one run id, steps 1..MAX once each, in order
    parts = wandb_offline(run)
    assert len(parts) == 3 and {p["run_id"] for p in parts} == {f"trackers-{run.name}"}
    steps = [s for p in parts for s in p["steps"]]
    assert steps == list(range(1, MAX + 1)), [p["steps"] for p in parts]
    assert all(p["steps"] for p in parts)  # every attempt logged its own part
    assert all("loss" in row for p in parts for row in p["rows"])
    marks = [row for p in parts for row in p["rows"] if "failure_class/timed_out" in row]
    assert len(marks) == 2  # each requeue's class, on the next attempt's first step

    # MLflow: one run in the file store, the same axis, attempts as tags
    [found] = mlflow_runs(run)
    assert mlflow_steps(run, found.info.run_id) == list(range(1, MAX + 1))
    assert found.data.tags["attempt"] == "3" and found.info.status == "FINISHED"
    assert {f"attempt.{n}.outcome" for n in (1, 2, 3)} <= set(found.data.tags)
