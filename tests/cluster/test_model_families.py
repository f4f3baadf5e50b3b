"""Beyond OPT on the real local cluster: llama_tiny and qwen2_tiny train on two Slurm
nodes, crash once, are requeued by the supervisor and resume from the checkpoint bitwise (the
steps computed twice give the same losses), and finish with every step once."""

from __future__ import annotations

import pytest

from slurmtrain.common.events import CheckpointLoaded, Finished, Requeued, Stopped
from tests.cluster.helpers import events, steps_by_attempt, submit_run, wait_event
from tests.conftest import read_jsonl

pytestmark = pytest.mark.slurm
BASE = [
    "cluster=slurm",
    "nodes=2",
    "cluster.cpu_tasks_per_node=1",
    "train.log_interval=1",
    "train.max_steps=10",
    "checkpoint.interval_steps=4",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
]


def test_families_are_requeued_after_a_crash_and_resume_bitwise(slurm_cluster, workdir):
    # Both families at once (2 nodes each of the 4): one test's wall time, not two.
    runs = {
        family: submit_run(
            BASE, workdir, family, [f"model={family}"], inject="crash_at_step=7,attempts=1"
        )
        for family in ("llama_tiny", "qwen2_tiny")
    }
    for family, run in runs.items():
        wait_event(run, Finished, timeout=600, fail_on=(Stopped,))
        ev = events(run)
        assert any(isinstance(e, Requeued) for e in ev), family
        [loaded] = [e for e in ev if isinstance(e, CheckpointLoaded)]
        assert loaded.step == 4, family
        attempts = steps_by_attempt(run)
        first, *rest = sorted(attempts)
        assert attempts[first] == list(range(1, 7)) and rest, (family, attempts)
        assert [s for a in rest for s in attempts[a]] == list(range(5, 11)), (family, attempts)
        loss = {(r["attempt"], r["step"]): r["loss"] for r in read_jsonl(run / "metrics.jsonl")}
        for step in (5, 6):  # computed by attempt 1 and again after the requeue: the same bits
            assert loss[(first, step)] == loss[(rest[0], step)], (family, step)
