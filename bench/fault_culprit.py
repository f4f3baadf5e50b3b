"""The fault matrix's culprit column: the node each fault puts at fault against the verdict's.

A fault that puts one node at fault injects it through one rank (`bad_rank=R`, `stall_rank=R`
with R alternating 1, 0 over the trials: Trial.culprit_rank; `absent_rank=1`, rank 1's slurmd
killed): its node is that rank's in the attempt the fault hit
(`started`'s hosts, or before `started` the step's nodes in Slurm's order, one rank per node in
these trials). The verdict (`attempt_verdict`, batch/culprit.py) of that attempt, the trial's
first, names a node or none. A configuration or user error puts no node at fault: none of its
verdicts may name one. Faults of neither kind are not scored.

Per fault: precision = right node named / any node named, recall = right node named / trials
with a node at fault (a verdict missing counts as none named).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from fault_trial import Trial

from slurmtrain.common import events

# fault -> the rank whose node it puts at fault (None: a configuration/user error, no node)
NODE_AT_FAULT = {
    "node_failure": 1,
    "bad_node": 1,
    "node_never_joins": 1,
    "hang_on_one_rank": 1,
    # bench/fault_recipes_local.py: rank 1's node killed (local tier), the batch node (rank 0's)
    "local_tier_node_loss": 1,
    "corrupt_buddy": 1,
    "both_local_copies_lost": 1,
    "batch_node_loss": 0,
}
USER_ERROR = ("user_error", "crash_loop", "resubmit_after_stop")


@dataclass
class Culprit:
    """One trial: the node the fault put at fault (None: none), the nodes its verdicts named, and
    the first verdict's confidence."""

    injected: Optional[str]
    named: list[str]
    confidence: str
    verdicts: int


def injected_node(t: Trial, rank: int, verdict: events.AttemptVerdict) -> Optional[str]:
    """Rank `rank`'s node in the attempt `verdict` judged."""
    ev = t.events()
    for e in ev:
        if isinstance(e, events.Started) and verdict.attempt is not None:
            if e.attempt == verdict.attempt and rank < len(e.hosts):
                return e.hosts[rank]
    waited = [
        e
        for e in ev
        if isinstance(e, events.Failed) and e.job_id == verdict.job_id and e.step_nodes
    ]
    return waited[0].step_nodes[rank] if waited and rank < len(waited[0].step_nodes) else None


def score(fault: str, t: Trial) -> Optional[Culprit]:
    """The trial's culprit figures, None for a fault that is not scored."""
    if fault not in NODE_AT_FAULT and fault not in USER_ERROR:
        return None
    verdicts = t.of(events.AttemptVerdict)
    if fault in USER_ERROR:
        named = [str(v.culprit_node) for v in verdicts if v.culprit_node]
        return Culprit(None, named, verdicts[0].confidence if verdicts else "-", len(verdicts))
    if not verdicts:
        return Culprit("?", [], "-", 0)
    first = verdicts[0]
    rank = t.culprit_rank if t.culprit_rank is not None else NODE_AT_FAULT[fault]
    node = injected_node(t, rank, first)
    named = [first.culprit_node] if first.culprit_node else []
    return Culprit(node, named, first.confidence, len(verdicts))


def row_fields(c: Optional[Culprit]) -> dict[str, Any]:
    """The trial row's culprit fields (what the table and the details print)."""
    if c is None:
        return {}
    return {
        "injected": c.injected or "none",
        "named": ",".join(c.named) or "none",
        "confidence": c.confidence,
        "right": c.injected is not None and c.named == [c.injected],
        "verdicts": c.verdicts,
    }


def _pct(num: int, den: int) -> str:
    return f"{num}/{den} ({num / den:.0%})" if den else "-"


def figures(rows: list[dict[str, Any]]) -> tuple[str, str, str]:
    """(culprit column, precision, recall) over one fault's trial rows ('-' when not scored)."""
    scored = [r for r in rows if "injected" in r]
    if not scored:
        return "-", "-", "-"
    named = [r for r in scored if r["named"] != "none"]
    right = sum(bool(r["right"]) for r in scored)
    at_fault = [r for r in scored if r["injected"] != "none"]
    pairs = sorted({f"{r['injected']}->{r['named']} ({r['confidence']})" for r in scored})
    column = "; ".join(pairs)
    if not at_fault:  # a configuration/user error: how many verdicts named a node at all
        return column + f"; nodes blamed: {len(named)}", "-", "-"
    return column, _pct(right, len(named)), _pct(right, len(at_fault))


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """The acceptance lines: precision and recall over every node-at-fault trial, and the nodes
    blamed over every configuration/user trial."""
    at_fault = [r for r in rows if r.get("injected") not in (None, "none")]
    user = [r for r in rows if r.get("injected") == "none"]
    named = [r for r in at_fault if r["named"] != "none"]
    right = sum(bool(r["right"]) for r in at_fault)
    high = [r for r in at_fault if r["confidence"] == "high"]
    return [
        f"culprit, node-at-fault faults: {len(at_fault)} trials, precision {_pct(right, len(named))}"
        f", recall {_pct(right, len(at_fault))}, high confidence in {len(high)}",
        f"culprit, configuration/user errors: {len(user)} trials, "
        f"verdicts naming a node: {sum(r['named'] != 'none' for r in user)}",
    ]
