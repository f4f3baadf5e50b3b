"""Which nodes the next attempt excludes: failed nodes, for a while, never more than the job can spare.

Rows come from the bad-node ledger (`bad_nodes.jsonl`: the health gate, local device errors, ranks
stuck before `started`). An exclusion expires after `faults.exclude_hours`; stragglers are only
advisory. The newest exclusions are kept, and only as many as leave the partition enough nodes for
the request (`nodes`): the oldest are dropped first. When even the user's own `cluster.exclude`
leaves too few nodes, no node set can run the job and the run stops, saying so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from slurmtrain.common import slurm_cmd
from slurmtrain.common import slurm_text as slurm
from slurmtrain.common.rundir import RunDir, read_jsonl
from slurmtrain.common.schema import node_range


@dataclass
class Exclusions:
    nodes: list[str]  # what --exclude gets (ours that fit + the user's)
    dropped: list[str] = field(default_factory=list)  # ours, left out so the job still fits
    reasons: dict[str, str] = field(default_factory=dict)
    problem: Optional[str] = None  # set when no node set can run the job

    def describe(self) -> str:
        return ", ".join(f"{n} ({self.reasons.get(n, 'cluster.exclude')})" for n in self.nodes)


def active(rows: list[dict[str, Any]], hours: float, now: float) -> dict[str, dict[str, Any]]:
    """node -> its newest failure row, for failures newer than `hours` (stragglers left out)."""
    newest: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.get("reason") == "straggler" or not row.get("node"):
            continue
        when = float(row.get("time") or 0)
        if hours >= 0 and when < now - hours * 3600:
            continue
        if row["node"] not in newest or when >= float(newest[row["node"]].get("time") or 0):
            newest[row["node"]] = row
    return newest


def fit(
    failed: dict[str, dict[str, Any]],
    user: list[str],
    partition_nodes: Optional[list[str]],
    needed: int,
) -> Exclusions:
    """Keep the newest failed nodes while the partition still holds `needed` nodes."""
    reasons = {n: str(r.get("reason") or "failed") for n, r in failed.items()}
    order = sorted(failed, key=lambda n: float(failed[n].get("time") or 0), reverse=True)
    if partition_nodes is None:  # the partition is unknown: trust the rows
        return Exclusions(sorted(set(order) | set(user)), [], reasons)
    members = set(partition_nodes)
    left = members - set(user)
    if len(left) < needed:
        return Exclusions(
            sorted(set(user)),
            order,
            reasons,
            problem=(
                f"no node set can run the job: nodes={needed} but the partition has "
                f"{len(members)} nodes and cluster.exclude={slurm.compress_hostlist(user)} leaves "
                f"{len(left)}"
            ),
        )
    kept, dropped = [], []
    for node in order:
        if node in left and len(left) - 1 >= needed:
            left.discard(node)
            kept.append(node)
        elif node in members:
            dropped.append(node)
    return Exclusions(sorted(set(kept) | set(user)), dropped, reasons)


def plan(run: RunDir, cfg: Any, now: Optional[float] = None) -> Exclusions:
    """The exclusions of the next attempt of this run."""
    now = time.time() if now is None else now
    failed = active(read_jsonl(run.bad_nodes), float(cfg.faults.exclude_hours), now)
    user = slurm.expand_hostlist(cfg.cluster.exclude) if cfg.cluster.exclude else []
    needed = node_range(cfg.nodes)[0]
    try:
        parts = slurm_cmd.query_partitions()
    except slurm.SlurmError:
        parts = {}
    name = cfg.cluster.partition or next((p for p, i in parts.items() if i.default), None)
    info = parts.get(name) if name else None
    return fit(failed, user, list(info.node_names) if info else None, needed)
