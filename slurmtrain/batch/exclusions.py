"""Which nodes the next attempt excludes: failed nodes, for a while, never more than the job can spare.

Rows come from the bad-node ledger (`bad_nodes.jsonl`: the health gate, local device errors, ranks
stuck before `started`) and from the ledger's verdicts (`attempt_verdict`, batch/culprit.py): the
culprit node of a node failure or hang judged with high confidence. An exclusion expires after `faults.exclude_hours`; stragglers are only
advisory. The newest exclusions are kept, and only as many as leave the partition enough nodes for
the request (`nodes` plus `faults.spare_nodes`: the job holds its spares too): the oldest are
dropped first, so a node that failed once is tried again.
A node that failed again after that retry (in two jobs within `exclude_hours`) is never dropped:
when those nodes, or the user's own `cluster.exclude`, leave too few nodes, no node set can run
the job and the run stops, saying so, instead of taking turns on broken nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from slurmtrain.common import events, slurm_cmd, slurm_text
from slurmtrain.common.derived import node_range
from slurmtrain.common.events import Confidence, FailureClass
from slurmtrain.common.jsonl import as_number, read_jsonl
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig

# Classes a node can cause: a verdict of these, when sure, excludes its culprit (from_verdicts).
NODE_CLASSES = (FailureClass.node_failure, FailureClass.hang)


@dataclass
class Exclusions:
    nodes: list[str]  # what --exclude gets (ours that fit + the user's)
    dropped: list[str] = field(default_factory=list)  # ours, left out so the job still fits
    reasons: dict[str, str] = field(default_factory=dict)
    problem: Optional[str] = None  # set when no node set can run the job

    def describe(self) -> str:
        return ", ".join(f"{n} ({self.reasons.get(n, 'cluster.exclude')})" for n in self.nodes)


# A bad_nodes.jsonl row (not a ledger row): node, reason, time, and the attempt that wrote it.
BadNodeRow = Mapping[str, object]


def _number(row: BadNodeRow, key: str, default: float = 0.0) -> float:
    """A numeric field of a bad-node row (`default` when absent or not a number)."""
    return as_number(row.get(key), default)


def active(rows: Sequence[BadNodeRow], hours: float, now: float) -> dict[str, dict[str, object]]:
    """node -> its newest failure row, for failures newer than `hours` (stragglers left out),
    with `jobs`: how many attempts (job id, restart, relaunch, attempt) it failed in then."""
    newest: dict[str, BadNodeRow] = {}
    jobs: dict[str, set[tuple[str, ...]]] = {}
    for row in rows:
        if row.get("reason") == "straggler" or not row.get("node"):
            continue
        when = _number(row, "time")
        if hours >= 0 and when < now - hours * 3600:
            continue
        node = str(row["node"])
        which = tuple(str(row.get(k)) for k in ("job_id", "restart", "relaunch", "attempt"))
        jobs.setdefault(node, set()).add(which)
        if node not in newest or when >= _number(newest[node], "time"):
            newest[node] = row
    return {node: {**row, "jobs": len(jobs[node])} for node, row in newest.items()}


def from_verdicts(rows: Sequence[events.Row], known: Sequence[BadNodeRow]) -> list[BadNodeRow]:
    """Bad-node rows for the culprit nodes of the ledger's high-confidence verdicts of a node
    class (medium or low: named, never excluded), unless the bad-node ledger already names that
    node for that attempt (a job counts once: `active`)."""
    seen = {(str(r.get("node")), str(r.get("attempt"))) for r in known}
    found: list[BadNodeRow] = []
    for e in rows:
        if not isinstance(e, events.AttemptVerdict) or not e.culprit_node:
            continue
        if e.confidence != Confidence.high or e.cls not in NODE_CLASSES:
            continue
        if (e.culprit_node, str(e.attempt)) in seen:
            continue
        found.append(
            {
                "node": e.culprit_node,
                "reason": f"verdict: {e.cls}, culprit rank {e.culprit_rank}",
                "time": e.time,
                "attempt": e.attempt,
                "job_id": e.job_id,
                "restart": e.restart,
                "relaunch": e.relaunch,
            }
        )
    return found


def fit(
    failed: dict[str, dict[str, object]],
    user: list[str],
    partition_nodes: Optional[list[str]],
    needed: int,
    asked: str = "",
) -> Exclusions:
    """Keep the newest failed nodes while the partition still holds `needed` nodes; nodes that
    failed again after a retry (`jobs` >= 2) are always kept. `asked`: how the request reads in
    the problem line (default `nodes=<needed>`)."""
    reasons = {n: str(r.get("reason") or "failed") for n, r in failed.items()}
    order = sorted(failed, key=lambda n: _number(failed[n], "time"), reverse=True)
    if partition_nodes is None:  # the partition is unknown: trust the rows
        return Exclusions(sorted(set(order) | set(user)), [], reasons)
    members = set(partition_nodes)
    again = [n for n in order if n in members and _number(failed[n], "jobs", 1) >= 2]
    left = members - set(user) - set(again)
    if len(left) < needed:
        why = [f"cluster.exclude={slurm_text.compress_hostlist(user)}"] if user else []
        if again:
            why.append(f"{', '.join(sorted(again))} failed again after a retry")
        return Exclusions(
            sorted(set(user) | set(again)),
            [n for n in order if n not in again],
            reasons,
            problem=(
                f"no node set can run the job: {asked or f'nodes={needed}'} but the partition has "
                f"{len(members)} nodes and {' and '.join(why)}: {len(left)} left"
            ),
        )
    kept, dropped = list(again), []
    for node in (n for n in order if n not in again):
        if node in left and len(left) - 1 >= needed:
            left.discard(node)
            kept.append(node)
        elif node in members:
            dropped.append(node)
    return Exclusions(sorted(set(kept) | set(user)), dropped, reasons)


def plan(run: RunDir, cfg: RootConfig, now: Optional[float] = None) -> Exclusions:
    """The exclusions of the next attempt of this run."""
    now = time.time() if now is None else now
    rows: list[BadNodeRow] = list(read_jsonl(run.bad_nodes))
    rows += from_verdicts(run.run_events(), rows)
    failed = active(rows, float(cfg.faults.exclude_hours), now)
    user = slurm_text.expand_hostlist(cfg.cluster.exclude) if cfg.cluster.exclude else []
    spares = int(cfg.faults.spare_nodes)  # held beside `nodes` (login/flags.py): they must fit too
    needed = node_range(cfg.nodes)[0] + spares
    asked = f"nodes+faults.spare_nodes={needed}" if spares else ""
    try:
        parts = slurm_cmd.query_partitions()
    except slurm_text.SlurmError:
        parts = {}
    name = cfg.cluster.partition or next((p for p, i in parts.items() if i.default), None)
    info = parts.get(name) if name else None
    return fit(failed, user, list(info.node_names) if info else None, needed, asked)
