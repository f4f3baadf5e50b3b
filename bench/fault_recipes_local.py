"""The fault matrix's node-local tier and batch-node faults (issue 38): how each is produced.

The local-tier recipes run bench/local_tier_drill.py's configuration (a local copy every 2 steps,
one `{node}` directory per rank's node, SLURMTRAIN_LOCAL_RANKS_PER_NODE=1 since the cluster's
nodes share one host) on 2 Slurm nodes, kill rank 1's node and take its storage with it; the
resumed attempt's `resume_source` rows must name the tier the surviving copies allow. The
batch-node loss is tests/cluster/test_successor.py's: nodes=1, no Slurm requeue, the node killed;
the queued successor must resume the run with no human action and leave nothing in the queue.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fault_trial import FINISHED, Check, Trial, Want, kill_node, rank1, sh  # noqa: E402
from local_tier_drill import LOCAL_ENV, local_tier_args, resume_tiers  # noqa: E402

from slurmtrain.batch.successor import job_name  # noqa: E402
from slurmtrain.common import events  # noqa: E402
from tests.cluster.helpers import job_pids, queued_of  # noqa: E402

LOCAL, BUDDY, SHARED = "local", "buddy", "shared"


def _resumed_tiers(t: Trial, want: set[str]) -> Check:
    """Clean when the attempt after the fault resumed from exactly the tiers `want`."""

    def problem(tr: Trial) -> Optional[str]:
        starts = tr.of(events.Started)
        if len(starts) < 2 or starts[1].attempt is None:
            return f"{len(starts)} attempt(s): the fault caused no resume"
        got = resume_tiers(tr.path, starts[1].attempt)
        return None if got["tiers"] == want else f"resumed from {got}, want tiers {sorted(want)}"

    return Check(f"resume tiers {sorted(want)}", problem)


def _lose_node1(t: Trial, harm: Callable[[Path], None] = lambda _: None) -> None:
    """Train with a hot spare, kill rank 1's node past a local save, delete its local storage;
    `harm` then gets node 0's local directory (where node 1's buddy copies are held). The spare
    takes node 1's place inside the job (its `{node}` directory is node 1's, now empty)."""
    args = [*local_tier_args(t.workdir), "faults.spare_nodes=1"]
    t.submit(args, inject="step_delay=0.5", extra=LOCAL_ENV)
    t.wait_step(11)  # local copies at 2, 4, .., 10; the shared tier at 8
    victim, rank_pid = rank1(t.of(events.Started)[-1])
    kill_node(t, victim, [rank_pid])
    # rank 1 is dead: nothing writes node 1's own copies or node 0's copies of them any more
    for own in (t.workdir / "local" / "node1").glob("*/own"):
        shutil.rmtree(own)
    harm(t.workdir / "local" / "node0")
    t.notes.append(f"killed {victim}")


def local_tier_node_loss(t: Trial) -> tuple[str, Want]:
    # node 0 loads its own copy; node 1's comes from node 0's buddy copy
    _lose_node1(t)
    return FINISHED, _resumed_tiers(t, {LOCAL, BUDDY})


def corrupt_buddy(t: Trial) -> tuple[str, Want]:
    # node 1's buddy copies on node 0 zeroed (the drill's corruption): every rank takes the shared
    # tier, its reason logged
    def zero(node0: Path) -> None:
        for held in node0.glob("*/buddy/1/step_*"):
            for shard in held.glob("*optim_states.pt"):
                shard.write_bytes(b"\0" * shard.stat().st_size)
                t.corrupted.add(f"buddy:{held.name}")

    _lose_node1(t, zero)
    return FINISHED, _resumed_tiers(t, {SHARED})


def both_local_copies_lost(t: Trial) -> tuple[str, Want]:
    def lose(node0: Path) -> None:
        for held in node0.glob("*/buddy/1"):
            shutil.rmtree(held)

    _lose_node1(t, lose)
    return FINISHED, _resumed_tiers(t, {SHARED})


def _successor_took_over(t: Trial) -> Optional[str]:
    queued = t.of(events.SuccessorQueued)
    takers = {str(e.job_id) for e in t.of(events.Started)[1:]}
    loaded = {str(e.job_id) for e in t.of(events.CheckpointLoaded)}
    if not queued or str(queued[0].new_job_id) not in takers & loaded:
        return f"successor {[e.new_job_id for e in queued]} did not resume it: trained by {takers}"
    deadline = time.time() + 60
    while queued_of(t.name, t.path) and time.time() < deadline:
        time.sleep(2)
    left = queued_of(t.name, t.path)
    return f"still queued as {job_name(t.name, t.path)}: {left}" if left else None


def batch_node_loss(t: Trial) -> tuple[str, Want]:
    args = ["nodes=1", "train.max_steps=24", "checkpoint.interval_steps=4"]
    t.submit(args, inject="step_delay=0.5")
    t.wait_event(events.CheckpointSaved)
    [started] = t.of(events.Started)
    # no Slurm requeue (a site without it, or past MaxBatchRequeue): the successor's case

    sh("scontrol", "update", f"jobid={started.job_id}", "requeue=0")
    kill_node(t, started.hosts[0], job_pids(str(started.job_id)))
    t.notes.append(f"killed batch node {started.hosts[0]}")
    t.wait_event(events.Finished, timeout=600)  # the node's death takes Slurm a while to notice
    return FINISHED, Check("successor resumed, queue empty", _successor_took_over)


LOCAL_FAULTS = {
    "local_tier_node_loss": local_tier_node_loss,
    "corrupt_buddy": corrupt_buddy,
    "both_local_copies_lost": both_local_copies_lost,
    "batch_node_loss": batch_node_loss,
}
