"""Restart inside the job's allocation: which healthy nodes run the next attempt, without the queue.

Why: at hundreds of nodes a run fails every few hours, and a trip through a busy queue is where the
time goes. A job that holds spare nodes with `--no-kill` (faults.spare_nodes) survives a node's
death; Slurm shrinks the allocation to the survivors and a new srun starts at once on them. So after
a node failure, hang, crash or bad node the supervisor names the next step's nodes: the previous
step's healthy nodes first (ranks keep their hosts), a spare for each failed one, the same world
size; with a `nodes` range and no spare left, fewer nodes (the universal checkpoint reshapes). When
neither works, the caller falls back to requeue/resubmit.

A failed node is seen by the step, not by waiting for Slurm: the ranks' own rows name it (device
error, health gate, a rank stuck before `started`), or its slurmd does not answer a connection
(slurm_cmd.unreachable_nodes) while Slurm has not yet marked it down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from slurmtrain.common import ledger as faults
from slurmtrain.common import slurm_cmd
from slurmtrain.common import slurm_text as slurm
from slurmtrain.common.schema import node_range, restarts_in_allocation

# Classes a fresh srun on other nodes can cure. Time limit and preemption end the allocation; an
# OOM, divergence, unreadable checkpoints or a config error would fail again on any nodes.
RELAUNCH_CLASSES = (faults.NODE_FAILURE, faults.HANG, faults.CRASH)


@dataclass
class Relaunch:
    """The next step inside this allocation: its nodes, and what changed since the last one."""

    nodes: list[str]
    failed: list[str] = field(default_factory=list)  # left out of the step: dead, bad or suspect
    swapped_in: list[str] = field(default_factory=list)  # spares now training
    spares_left: int = 0  # healthy allocation nodes not in the step

    def write(self, path: str) -> None:
        """`HOSTLIST COUNT` for the batch script's `read -r hosts n`."""
        Path(path).write_text(f"{slurm.compress_hostlist(self.nodes)} {len(self.nodes)}\n")


def allocation_nodes(job_id: str, env: dict[str, str]) -> list[str]:
    """The job's nodes now (Slurm drops a dead node from a --no-kill allocation once it marks it
    down); the batch environment's list when scontrol cannot answer."""
    try:
        listed = slurm_cmd.job_info(job_id).get("NodeList", "")
    except slurm.SlurmError:
        listed = ""
    listed = listed if listed and listed != "(null)" else env.get("SLURM_JOB_NODELIST", "")
    return slurm.expand_hostlist(listed) if listed else []


def step_hosts(events: list[dict[str, Any]], attempt: Optional[int]) -> list[str]:
    """The finished step's nodes in rank order (its `started` row), empty if it never started."""
    for e in reversed(events):
        if e["event"] == "started" and attempt is not None and e.get("attempt") == attempt:
            return list(dict.fromkeys(str(h) for h in e.get("hosts") or []))
    return []


def suspects(
    cls: str, named: list[str], rows: list[dict[str, Any]], events: list[dict[str, Any]]
) -> list[str]:
    """Nodes the failure points at: those the verdict named; for a crash whose real errors all
    come from one node, that node (swapped out only while a spare is at hand)."""
    if named or cls != faults.CRASH:
        return sorted(set(named))
    real = faults.real_errors([e for e in rows if e["event"] == "failed"])
    nodes = {faults.row_node(e, events) for e in real} - {None}
    return sorted(nodes) if len(nodes) == 1 else []  # type: ignore[arg-type]


def plan(
    cfg: Any,
    cls: str,
    allocation: list[str],
    previous: list[str],
    failed: list[str],
    excluded: list[str],
    optional: list[str] = (),  # type: ignore[assignment]
) -> Optional[Relaunch]:
    """Nodes for the next attempt in this allocation, or None when it cannot hold the run.

    `failed`: nodes that must go (dead, bad); `excluded`: the run's active exclusions;
    `optional`: suspects swapped out only while enough other nodes remain."""
    if cls not in RELAUNCH_CLASSES or not restarts_in_allocation(cfg):
        return None
    low, high = node_range(cfg.nodes)
    out = set(failed) | set(excluded)
    healthy = [n for n in allocation if n not in out]
    want = min(len(previous) or high, high)
    spare_ok = [n for n in healthy if n not in optional]
    if len(spare_ok) >= want:
        healthy = spare_ok  # drop the suspects too: there is room without them
    if len(healthy) < low:
        return None
    count = min(want, len(healthy))
    ordered = [n for n in previous if n in healthy] + [n for n in healthy if n not in previous]
    chosen = ordered[:count]
    gone = [n for n in previous if n not in chosen]
    return Relaunch(
        nodes=chosen,
        failed=sorted(gone),
        swapped_in=[n for n in chosen if n not in previous],
        spares_left=len(healthy) - count,
    )
