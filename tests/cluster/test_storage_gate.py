"""The health gate's storage probe on the real local cluster: a node whose run mount is read-only
(`bad_storage_node`: a real read-only bind mount in the probe's own mount namespace) is failed
before any rank loads, named with the reason in the ledger, and excluded by the next attempt."""

from __future__ import annotations

import pytest

from slurmtrain.common.events import BadNode, Finished, Started
from tests.cluster.helpers import events, steps_by_attempt, submit_run, wait_event
from tests.conftest import read_jsonl

pytestmark = pytest.mark.slurm
BASE = ["cluster=slurm", "train.log_interval=1", "faults.health_check=true"]


def test_a_node_with_a_read_only_run_mount_is_excluded_before_any_rank_loads(
    slurm_cluster, workdir
):
    # n4 left out: an idle cluster places the 2-node job on n1+n2 and the restart on n2+n3.
    args = ["nodes=2", "train.max_steps=5", "checkpoint.interval_steps=5", "cluster.exclude=n4"]
    run = submit_run(BASE, workdir, "rostore", args, inject="bad_storage_node=n1,attempts=1")
    wait_event(run, Finished, timeout=400, fail_on=())
    ev = events(run)
    starts = [e for e in ev if isinstance(e, Started)]
    if "n1" not in starts[0].hosts:
        pytest.skip(f"another job held n1; the first attempt ran on {starts[0].hosts}")
    [bad] = [e for e in ev if isinstance(e, BadNode)]
    assert bad.node == "n1" and bad.attempt == starts[0].attempt
    assert bad.reason == (
        f"storage: run dir {run}: writable: cannot create a file: Read-only file system (errno 30)"
    )
    assert bad.time - starts[0].time < 60  # at the gate, not at the load phase's deadline
    # advisory straggler rows (a loaded 2-core host's timing noise) are not exclusions
    reasons = [r["reason"] for r in read_jsonl(run / "bad_nodes.jsonl")]
    assert [r for r in reasons if r != "straggler"] == [bad.reason]
    assert starts[0].attempt not in steps_by_attempt(run)  # nothing loaded or trained there
    assert "n1" not in starts[-1].hosts and len(starts) == 2
