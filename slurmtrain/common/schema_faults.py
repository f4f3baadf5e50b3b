"""The straggler keys of the schema's `faults` section (FaultsConfig inherits them): kept here so
schema.py stays within the house line limit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class StragglerKeys:
    # Every log interval each rank's data+forward time per micro step is scored against the
    # median rank's (compute/observe/stragglers.py); a node's score is its slowest rank's.
    stragglers: bool = True  # off: no section clocks, no scoring (bench/perf_overhead.py's B)
    # A node above threshold x the median: a `straggler` row; that many log intervals in a row: a
    # chronic straggler. 1.3/5: a clean 2,000-step run on a loaded 2-core host stays quiet (its
    # CPU-time scores reached 1.8 in single windows, 1.3 for at most 4 in a row).
    straggler_threshold: float = 1.3
    straggler_windows: int = 5
    # A chronic straggler goes to the bad-node ledger: the next attempt excludes it (or a spare
    # replaces it). None: true when the run has spares (faults.spare_nodes > 0).
    exclude_stragglers: Optional[bool] = None
