"""Who this process is in this attempt: the `Attempt` (its number and ledger writes) and the
`RankContext` every compute component is built with (placement, device, ledger writes, watchdog,
phase deadlines), so components take their config section plus one context, not a dozen values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol

from slurmtrain.common import events
from slurmtrain.common.events import Rows
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.slurm_text import attempt_counters
from slurmtrain.compute import startup
from slurmtrain.compute.distributed import Placement
from slurmtrain.compute.faults.watchdog import Watchdog
from slurmtrain.planning.deadlines import Deadlines

if TYPE_CHECKING:
    import torch


class Record(Protocol):
    """A ledger write: one row object (rank 0 writes one copy: Attempt.record)."""

    def __call__(self, row: events.Row) -> None: ...


def restart_count() -> int:
    return attempt_counters(os.environ)[0]


def relaunch_count() -> int:
    """In-allocation restarts before this one in the same job (the batch script counts them)."""
    return attempt_counters(os.environ)[1]


class Attempt:
    """One start of the job on the compute nodes: placement, attempt number, ledger writes."""

    def __init__(
        self,
        run: RunDir,
        where: Placement,
        nodes: list[str],
        number: int,
        rows: Optional[Rows] = None,
    ) -> None:
        self.run, self.where, self.nodes, self.number = run, where, nodes, number
        # Rank 0: the run tier read once at the start plus every row recorded since, so checkpoint
        # choice, rollbacks and budgets never re-read the ledger.
        self.rows: Rows = rows if rows is not None else []

    step: Optional[int] = None  # the step being trained, for failure records
    clock: Optional[startup.StartupClock] = None  # rank 0: start-up phases (compute/startup.py)

    def record(self, row: events.Row) -> None:
        """Rank 0 writes the attempt's rows (one copy, not one per rank), in the run tier; the
        row's own placement (a straggler's rank and node) is kept, this rank's fills the rest."""
        if self.where.rank == 0:
            self.rows.append(
                self.run.record(
                    row,
                    job_id=self.where.job_id,
                    attempt=self.number,
                    nodes=self.nodes,
                    durable=None,  # by the row's class (RunDir.record)
                    rank=self.where.rank,
                    node=self.where.node,
                )
            )

    def record_any(self, row: events.Row) -> None:
        """Any rank: failures are recorded by the rank that saw them, in its node's file of the
        rank tier (one file per node, not per rank: common/jsonl.py)."""
        self.run.record_rank(
            row,
            job_id=self.where.job_id,
            restart=restart_count(),
            relaunch=relaunch_count(),
            on_node=self.where.node,
            attempt=self.number,
            nodes=(self.where.node,),  # its own: the attempt's list is in `started`, once
            rank=self.where.rank,
        )


@dataclass(frozen=True)
class RankContext:
    """What every component of an attempt needs about its rank, built once per attempt.
    `deadlines` is None until the checkpoint is chosen (they scale with its bytes)."""

    where: Placement
    device: torch.device
    record: Record
    watchdog: Watchdog
    deadlines: Optional[Deadlines] = None

    @property
    def rank(self) -> int:
        return self.where.rank

    @property
    def world(self) -> int:
        return self.where.world_size

    @property
    def node(self) -> str:
        return self.where.node
