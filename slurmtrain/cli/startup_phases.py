"""Each attempt's start-up, phase by phase (the `startup` rows rank 0 records after its first
step: compute/startup.py), as the text table `report` prints. Login node: no torch."""

from __future__ import annotations

from typing import Iterable, Optional

from slurmtrain.common import events
from slurmtrain.common.events import Row

# The compute side's order (compute/startup.py PHASES); a phase not listed goes after them.
ORDER = (
    "launch",
    "imports",
    "rendezvous",
    "health",
    "choose",
    "convert",
    "build",
    "deepspeed_init",
    "load",
    "first_step",
)
SHORT = {"deepspeed_init": "ds_init", "first_step": "1st step", "rendezvous": "rendezv"}


def startup_rows(ledger: Iterable[Row]) -> list[events.Startup]:
    """One `startup` row per attempt (the first, should a record be repeated)."""
    rows: list[events.Startup] = []
    seen: set[Optional[int]] = set()  # attempts
    for e in ledger:
        if isinstance(e, events.Startup) and e.phases is not None and e.attempt not in seen:
            seen.add(e.attempt)
            rows.append(e)
    return rows


def format_startup(ledger: Iterable[Row]) -> Optional[str]:
    """Seconds per phase, one line per attempt, and where its torch came from when staged."""
    rows = startup_rows(ledger)
    if not rows:
        return None
    names = [p for p in ORDER if any(p in _phases(r) for r in rows)]
    names += sorted({str(p) for r in rows for p in _phases(r)} - set(names))
    head = ["attempt", *(SHORT.get(p, p) for p in names), "total"]
    body = [
        [
            "?" if r.attempt is None else str(r.attempt),
            *(_sec(_phases(r).get(p)) for p in names),
            _sec(r.seconds),
        ]
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths))

    out = ["start-up (seconds, process start to first step)", line(head), *map(line, body)]
    staged = [r for r in rows if r.staged_env]
    if staged:
        out.append(f"staged environment: torch from {staged[-1].torch_from}")
    return "\n".join(out)


def _phases(row: events.Startup) -> dict[str, object]:
    """A `startup` row's seconds per phase (`startup_rows` keeps only rows that have them)."""
    return row.phases or {}


def _sec(value: object) -> str:
    return f"{float(value):.2f}" if isinstance(value, (int, float)) else "-"
