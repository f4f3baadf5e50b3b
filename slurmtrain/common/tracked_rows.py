"""What a tracker's backend (common/tracker_<name>.py) does with ledger rows: as JSON, credentials
redacted; their failure class; how an attempt ended; nested config as flat keys."""

from __future__ import annotations

import json
from typing import Optional

from slurmtrain.common import events, secrets
from slurmtrain.common.events import Row, Rows

# The rows that carry a failure class (`cls`): counted and tagged by it.
CLASSED = (events.AttemptEnded, events.Stopped, events.Failed, events.RelaunchAbandoned)


def event_row(row: Row) -> dict[str, object]:
    """A ledger row as a tracker keeps it (its JSON form): credentials redacted (errors may quote
    them)."""
    return {
        k: secrets.redact_text(v) if isinstance(v, str) else v
        for k, v in row.to_json().items()
        if k not in ("nodes", "hosts", "pids")  # O(nodes) lists: the ledger has them
    }


def failure_class(row: Row) -> Optional[str]:
    """The failure class a row carries (None: a kind without one, or an empty class)."""
    return (row.cls or None) if isinstance(row, CLASSED) else None


def outcome(kept: Rows) -> str:
    """How the attempt ended, for the tracker's run status: the kind of its Finished, Failed (or
    Stopped) or else Paused row (finished | failed | paused)."""
    if any(isinstance(row, events.Finished) for row in kept):
        return events.Finished.kind
    failed = any(isinstance(row, (events.Failed, events.Stopped)) for row in kept)
    return events.Failed.kind if failed else events.Paused.kind


def jsonl(rows: Rows) -> str:
    return "".join(json.dumps(event_row(e), default=str) + "\n" for e in rows)


def flat(data: object, prefix: str = "") -> dict[str, str]:
    """A nested mapping as `a.b.c` keys with text values (MLflow params, Aim-safe keys)."""
    if isinstance(data, dict):
        out: dict[str, str] = {}
        for k, v in data.items():
            out.update(flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): json.dumps(data) if not isinstance(data, str) else data}
