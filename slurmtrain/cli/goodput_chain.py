"""The chain of a run's attempts, read from its ledger rows and metrics.jsonl rows (for goodput).

Login-node code: no torch. An attempt spans from the start of its process to its last record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, NamedTuple, Optional

from slurmtrain.common import events
from slurmtrain.common.events import Row, Rows


class Step(NamedTuple):
    """A metrics row with a finite time and a step."""

    time: float
    step: int
    row: Mapping[str, object]


@dataclass
class Attempt:
    number: int
    begin: float = math.inf
    end: float = -math.inf
    started: Optional[float] = None
    loaded_step: Optional[int] = None
    rows: Rows = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    def see(self, t: float) -> None:
        self.begin, self.end = min(self.begin, t), max(self.end, t)

    def kinds(self) -> set[type[Row]]:
        return {type(e) for e in self.rows}

    def resume_step(self) -> Optional[int]:
        """Steps above this were (re)computed here. An attempt that started without loading a
        checkpoint began at step 0; the first step logged bounds it when the ledger is incomplete."""
        r = self.loaded_step
        if r is None and self.started is not None:
            r = 0
        known = [s for s in (r, (self.steps[0].step - 1) if self.steps else None) if s is not None]
        return min(known) if known else None


def num(x: object) -> Optional[float]:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def to_int(x: object) -> Optional[int]:
    v = num(x)
    return int(v) if v is not None else None


def timed(ledger: Iterable[Row]) -> Rows:
    """The ledger rows with a finite time, in time order."""
    return sorted((e for e in ledger if math.isfinite(e.time)), key=lambda e: e.time)


def timed_steps(metrics: Iterable[Mapping[str, object]]) -> list[Step]:
    """The metrics rows with a finite time and step, in time order."""
    found = []
    for m in metrics:
        t, step = num(m.get("time")), num(m.get("step"))
        if t is not None and step is not None:
            found.append(Step(t, int(step), m))
    return sorted(found, key=lambda m: m.time)


def chain_of(rows: Rows, steps: list[Step]) -> list[Attempt]:
    """The attempts in order, each with its ledger rows and steps, from the start of its process
    (before `started`: rendezvous_done.seconds counts from it, and the `startup` row names it)."""
    attempts: dict[int, Attempt] = {}
    for e in rows:
        n = e.attempt
        if isinstance(e, events.Submitted) or n is None or n < 1:
            continue
        a = attempts.setdefault(n, Attempt(n))
        a.see(e.time)
        a.rows.append(e)
        if isinstance(e, events.Started) and a.started is None:
            a.started = e.time
        if isinstance(e, events.CheckpointLoaded):
            a.loaded_step = e.step
    for m in steps:
        n = to_int(m.row.get("attempt")) or 1
        a = attempts.setdefault(n, Attempt(n))
        a.see(m.time)
        a.steps.append(m)
    chain = sorted(attempts.values(), key=lambda a: a.number)
    for a in chain:
        if a.started is not None:
            a.begin = a.started
        for e in a.rows:
            if isinstance(e, events.RendezvousDone) and (sec := num(e.seconds)) is not None:
                a.begin = min(a.begin, e.time - max(sec, 0.0))
            if isinstance(e, events.Startup) and (t := num(e.process_started_at)) is not None:
                a.begin = min(a.begin, t)  # the process's exec: interpreter and imports too
    return chain
