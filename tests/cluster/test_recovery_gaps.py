"""Issue #20 item 8 on the real cluster: exclusions leave room for the spares, and a SIGTERM
during the in-allocation relaunch decision still leaves a successor or a recorded class."""

from __future__ import annotations

import json
import time

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.batch import exclusions
from slurmtrain.common import schema
from slurmtrain.common.rundir import RunDir

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
