"""An attempt's start-up, phase by phase: from the process's own start to its first optimizer step.

Rank 0 keeps the clock and records one `startup` row per attempt after its first step (O(1): one
row, one write), with the seconds of each phase in order:
  launch          the process's start (exec by srun or the local executor) to attempt.run()
                  (the interpreter and slurmtrain's own imports; where the environment was staged
                  node-locally, that copy's imports)
  imports         torch and deepspeed
  rendezvous      init_distributed, the host gather, the run's claim and `started`
  health          the health gate (and the budget check before it)
  choose          which checkpoint (verification of its files when checksums are on)
  build           the model (meta device, no init, when a checkpoint overwrites it:
                  resume_build.py; the row's build_skipped_init says which)
  deepspeed_init  deepspeed.initialize and the checkpointer, data and metrics set-up
  load            the checkpoint's load (0 on a fresh start)
  first_step      the first optimizer step (its forward, backward, all-reduce and update)
`torch_from`: the file torch was imported from; `staged_env`: the node-local copy of the environment
the ranks run from (cluster.stage_env), else None.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional

from slurmtrain.common import events

PHASES = (
    "launch",
    "imports",
    "rendezvous",
    "health",
    "choose",
    "build",
    "deepspeed_init",
    "load",
    "first_step",
)


def process_started_at() -> float:
    """Unix time this process was exec'd (Linux /proc; the tick is 10 ms): what `launch` counts
    from, so interpreter start and the imports before our first line are in the record too."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of proc(5): starttime, in clock ticks since boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(age, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


class StartupClock:
    """Seconds per start-up phase; `mark(name)` closes the phase that ran since the last mark."""

    def __init__(self, began: Optional[float] = None) -> None:
        self.began = process_started_at() if began is None else began
        self.last = self.began
        self.seconds: dict[str, float] = {}
        self.facts: dict[str, object] = {}  # what a phase did (e.g. build_skipped_init)
        self.done = False

    def mark(self, name: str, **facts: object) -> None:
        self.facts.update(facts)
        now = time.time()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + max(now - self.last, 0.0), 3)
        self.last = now

    def row(self) -> events.Startup:
        """The `Startup` row: phases in order (missing ones 0), total, where torch is; the facts
        phases noted (build_skipped_init; any other is kept beside the row's fields)."""
        phases: dict[str, object] = {p: self.seconds.get(p, 0.0) for p in PHASES}
        phases.update({k: v for k, v in self.seconds.items() if k not in phases})
        skipped = self.facts.get("build_skipped_init")
        return events.Startup(
            phases=phases,
            seconds=round(self.last - self.began, 3),
            process_started_at=self.began,
            torch_from=_torch_file(),
            python=sys.executable,
            # the node-local copy this process runs from (the batch script's staging block)
            staged_env=os.environ.get("SLURMTRAIN_STAGED_ENV") or None,
            build_skipped_init=skipped if isinstance(skipped, bool) else None,
            extra={k: v for k, v in self.facts.items() if k != "build_skipped_init"},
        )

    def finish(self, record: Callable[[events.Row], object]) -> None:
        """After the first step: the one `Startup` row (rank 0 writes: Attempt.record)."""
        if self.done:
            return
        self.done = True
        self.mark("first_step")
        record(self.row())


def _torch_file() -> Optional[str]:
    torch = sys.modules.get("torch")
    return getattr(torch, "__file__", None) if torch is not None else None


def say_staged(rank: int, node: str) -> None:
    """cluster.stage_env: each rank's log names the copy its torch came from (one line)."""
    staged = os.environ.get("SLURMTRAIN_STAGED_ENV")
    if staged:
        print(
            f"slurmtrain: rank {rank} on {node}: staged {staged}, torch {_torch_file()}", flush=True
        )
