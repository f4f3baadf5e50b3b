"""The restart keys of the schema's `faults` section (FaultsConfig inherits them): the progress
guard and the queued successor (issue 38), kept here so schema.py stays within the line limit."""

from __future__ import annotations

from dataclasses import dataclass

from slurmtrain.common.schema_faults import StragglerKeys


@dataclass
class RestartKeys(StragglerKeys):  # one base for FaultsConfig: schema.py's lines
    # Attempts in a row, of any classes, that publish no new checkpoint on any tier: the run stops
    # as `no_progress` (common/progress.py); 0: off. Each class's own budget never sees them as one.
    max_no_progress_attempts: int = 3
    # Slurm: a pending `--dependency=singleton` copy of the job waits in the queue, so losing the
    # batch node or the allocation costs one queue wait, not a human (batch/successor.py).
    # Single runs only: a sweep's array shares one name (no singleton per point).
    successor: bool = True
