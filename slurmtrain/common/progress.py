"""The progress guard across failure classes: a run whose last N attempts (any mix of hang, crash,
node failure, ...) published no new checkpoint stops as `no_progress` (faults.max_no_progress_attempts).

Why: each class has its own budget, and `crash_loop` counts same-step crashes only, so a hang, then
a crash, then a node failure at one step were never seen as one run going nowhere. The guard reads
the ledger's typed rows only (no config beyond the limit), so the supervisor, the local executor's
close and the next start (common/ledger.py:over_budget) make the same decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from slurmtrain.common import events
from slurmtrain.common.events import FailureClass, Row
from slurmtrain.common.windows import window

# Rows that publish a checkpoint (any tier: a node-local tier's row joins this tuple).
PUBLISHED = (events.CheckpointSaved,)
# Not counted: a preemption is the scheduler's choice (its budget is unlimited by design), and a
# preemption storm must not stop a healthy run; a cancel is the user's.
NOT_COUNTED = (FailureClass.preempted, FailureClass.cancelled)
ATTEMPT_EDGES = (
    events.Started,
    events.AttemptEnded,
    events.Finished,
    events.Paused,
    events.Stopped,
)


@dataclass(frozen=True)
class Stall:
    """The attempts in a row that published nothing new: their classes, oldest first, and the
    newest published step before them (None: the run has no checkpoint)."""

    classes: tuple[str, ...]
    since_step: Optional[int]

    def describe(self) -> str:
        """`hang, crash, hang: no checkpoint since step 8` (the status line's parenthesis)."""
        since = f"since step {self.since_step}" if self.since_step is not None else "yet"
        return f"{', '.join(self.classes)}: no checkpoint {since}"


def stall(rows: Sequence[Row]) -> Stall:
    """The current streak of counted attempts, in the current budget window, that ended with no
    checkpoint newer than every earlier one (an attempt that advances resets it)."""
    current = window(rows)
    before = list(rows[: len(rows) - len(current)])
    best = max(
        (e.step for e in before if isinstance(e, PUBLISHED) and e.step is not None), default=None
    )
    streak: list[str] = []
    advanced = False
    for e in current:
        if isinstance(e, PUBLISHED) and e.step is not None and (best is None or e.step > best):
            best, advanced, streak = e.step, True, []  # even a preempted attempt's save counts
        elif isinstance(e, events.ResumeApplied):  # resume=none/step_N moved newer ones aside
            best = e.kept_step
        elif isinstance(e, events.AttemptEnded) and e.cls not in NOT_COUNTED:
            streak = streak if advanced else streak + [str(e.cls)]
            advanced = False
        elif isinstance(e, ATTEMPT_EDGES):  # saves before a start are an earlier attempt's
            advanced = False
    return Stall(tuple(streak), best)


def no_progress(rows: Sequence[Row], limit: int) -> Optional[Stall]:
    """The stall that stops the run (`limit` attempts or more; 0: the guard is off), else None."""
    if limit <= 0:
        return None
    found = stall(rows)
    return found if len(found.classes) >= limit else None
