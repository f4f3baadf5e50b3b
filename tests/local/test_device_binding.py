"""The compute entrypoint finds its device among those the task sees (CPU stand-in for the GPU list:
SLURMTRAIN_VISIBLE_DEVICES goes through the same compute.distributed.device_index)."""

from __future__ import annotations

from slurmtrain.common.events import Failed, Finished, Stopped
from tests.conftest import ledger_events, run_cli, run_dirs

FAST = ["cluster=local", "train.max_steps=4", "train.log_interval=2", "checkpoint.interval_steps=0"]


def test_one_visible_device_and_local_id_1_trains(workdir):
    # Two local tasks (local ids 0 and 1), each seeing one device: both use device 0.
    done = run_cli(FAST + ["name=bound"], cwd=workdir, env={"SLURMTRAIN_VISIBLE_DEVICES": "3"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    events = ledger_events(run_dirs(workdir / "runs")[0])
    assert any(isinstance(e, Finished) for e in events), events[-3:]


def test_a_binding_it_cannot_read_fails_with_the_lookup_error(workdir):
    # Three tasks but two devices listed: local id 2 cannot tell which is its own.
    done = run_cli(
        FAST
        + [
            "name=unbound",
            "cluster.cpu_tasks_per_node=3",
            "train.global_batch_size=12",
            "faults.max_crash=0",
        ],
        cwd=workdir,
        env={"SLURMTRAIN_VISIBLE_DEVICES": "4,5"},
    )
    assert done.returncode != 0
    events = ledger_events(run_dirs(workdir / "runs")[0])
    assert any(
        isinstance(e, (Failed, Stopped)) and "cannot tell which is its own" in e.error
        for e in events
    ), events[-3:]
