"""Rank 0's side of the trackers: the context a tracker's backend opens with, and the openers.

Each tracker's backend lives in its module, common/tracker_<name>.py (common/tracker_registry.py
finds them); a backend gets the config (secrets as references), the plan, each attempt's
provenance, the metrics and the ledger's events through RunContext. The tracker packages are
imported only when a backend opens (they are optional extras).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from slurmtrain.common import events, secrets, tracker_registry
from slurmtrain.common.events import Rows
from slurmtrain.common.schema import RootConfig
from slurmtrain.common.tracked_rows import event_row, failure_class
from slurmtrain.common.tracker_registry import Backend

__all__ = ["OPENERS", "Backend", "RunContext", "event_row", "failure_class"]


@dataclass
class RunContext:
    cfg: RootConfig
    path: Path  # the run directory
    run_id: str  # trackers.tracker_run_id
    fingerprint: str
    attempt: int
    rows: Rows  # rank 0's run tier

    def config(self) -> dict[str, object]:
        """The resolved config with every secret as a reference (what config.yaml holds)."""
        return secrets.referenced(self.cfg)

    def plan(self) -> dict[str, object]:
        """The login node's plan again (pure arithmetic): parameters, memory per rank, ETA lines."""
        from slurmtrain.common.derived import node_range
        from slurmtrain.planning import memory, preflight

        out: dict[str, object] = {}
        try:
            out["params"] = memory.param_count(self.cfg.model)
            low = node_range(self.cfg.nodes)[0]
            out["memory_per_rank_bytes"] = preflight.memory_plan(self.cfg, low).total
            out["text"] = preflight.report(self.cfg).text
        except Exception as err:  # a plan the login node printed; here it is only a record
            out["error"] = f"{type(err).__name__}: {err}"
        return out

    def provenance(self) -> dict[str, object]:
        """This attempt's provenance record (written, redacted, by rank 0 before training)."""
        path = self.path / "provenance" / f"attempt_{self.attempt}.json"
        try:
            record: dict[str, object] = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return record

    def started(self) -> Optional[events.Started]:
        for row in reversed(self.rows):
            if isinstance(row, events.Started) and row.attempt == self.attempt:
                return row
        return None


def _opener(t: tracker_registry.Tracker) -> Callable[[RunContext], Backend]:
    def open_it(ctx: RunContext) -> Backend:
        section = getattr(ctx.cfg.logger, t.name)
        assert section is not None  # opened only when chosen (trackers.wanted)
        return t.open(ctx, section)

    return open_it


OPENERS: dict[str, Callable[[RunContext], Backend]] = {
    t.name: _opener(t) for t in tracker_registry.trackers()
}
