"""A slurmctld restart in the middle of a run loses nothing (real cluster, real controller outage).

The harness stops only slurmctld (`tools/slurm_cluster.py restart-ctld`), keeps it down ~15 s and
starts it again, while a 2-node run trains. Nodes and the running job are untouched, as in a
controller restart or failover on a production cluster. This disturbs every other job on the test
cluster for those seconds: one test, one short outage.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from slurmtrain.common.events import (
    AttemptEnded,
    CheckpointLoaded,
    CheckpointSaved,
    Failed,
    Finished,
    Started,
    Stopped,
)
from tests.cluster.helpers import events, only_run, wait_event, wait_until
from tests.conftest import read_jsonl, run_cli

pytestmark = pytest.mark.slurm
STEPS, INTERVAL = 60, 5


def test_controller_restart_during_a_run_loses_nothing(slurm_cluster, workdir):
    args = [
        "cluster=slurm",
        "name=ctldrestart",
        "nodes=2",
        "train.log_interval=1",
        f"train.max_steps={STEPS}",
        f"checkpoint.interval_steps={INTERVAL}",
    ]
    inject = {"SLURMTRAIN_INJECT": "step_delay=0.5"}
    done = run_cli([*args, "faults.allow_inject=true"], cwd=workdir, env=inject)
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run(workdir / "runs", "ctldrestart")
    metrics = run / "metrics.jsonl"
    wait_until(
        lambda: metrics.exists() and max((r["step"] for r in read_jsonl(metrics)), default=0) >= 8,
        300,
        "step 8",
    )
    outage = subprocess.run(
        [
            sys.executable,
            str(slurm_cluster.harness),
            "restart-ctld",
            "--down-s",
            "15",
            "--state-dir",
            str(slurm_cluster.state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert outage.returncode == 0, outage.stdout + outage.stderr
    during = max(r["step"] for r in read_jsonl(metrics))
    assert during < STEPS, "the run ended before the controller came back: nothing was tested"
    wait_event(run, Finished, timeout=500)

    ev = events(run)
    assert not any(isinstance(e, (Failed, Stopped)) for e in ev), ev
    starts = [e for e in ev if isinstance(e, Started)]
    # no duplicate trainer: every attempt after the first starts after the previous one ended
    for prev, nxt in zip(starts, starts[1:]):
        ended = [e for e in ev if isinstance(e, AttemptEnded) and e.attempt == prev.attempt]
        assert ended and ended[0].time <= nxt.time, (prev, nxt)
    rows = read_jsonl(metrics)
    by_attempt: dict[int, list[int]] = {}
    for r in rows:
        by_attempt.setdefault(r["attempt"], []).append(r["step"])
    for steps in by_attempt.values():
        assert steps == sorted(set(steps))  # one trainer per attempt: each step once
    if len(by_attempt) == 1:
        assert by_attempt[starts[0].attempt] == list(range(1, STEPS + 1))  # nothing lost
    else:  # a restart may redo at most the steps after the last checkpoint
        loads = [e.step for e in ev if isinstance(e, CheckpointLoaded)]
        first = by_attempt[min(by_attempt)]
        assert max(first) - loads[-1] <= INTERVAL
    # (other tests' jobs may preempt this one on the shared cluster: a signal save is off-interval)
    saved = sorted({e.step for e in ev if isinstance(e, CheckpointSaved)})
    assert saved[-1] == STEPS
    [fin] = [e for e in ev if isinstance(e, Finished)]
    assert fin.step == STEPS
    status = run_cli(["status", str(run)], cwd=workdir, module="slurmtrain.cli")
    assert "finished" in status.stdout, status.stdout + status.stderr
