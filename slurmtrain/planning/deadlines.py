"""Phase deadlines of an attempt: how long each phase may go without a heartbeat (else: a hang).

A single hang window cannot fit both a training step (seconds) and a 66B start-up (rank 0 reading
~0.9 TB, ZeRO-3 building, a save of ~15 min). Each phase gets its own deadline:

- `step`, `eval`: `faults.hang_timeout_s` (no step progress for this long);
- start-up phases without bulk IO (rendezvous, health gate, build): `faults.startup_timeout_s`;
- IO phases (verify, convert, load, save): `faults.io_floor_s + bytes / rate * faults.io_safety`.
  The ranks share one filesystem, so the rate is the job's: all ranks move their bytes at once
  (a rank's bytes x world size over the job's rate), as this run measured it in its ledger
  (`checkpoint_saved`, `checkpoint_verified`, `checkpoint_loaded`), else the planned
  `faults.io_write_mb_per_s` / `faults.io_read_mb_per_s`.

A heartbeat within a phase (a shard writer's chunk, a loader's file) starts its deadline over.
Pure arithmetic: no torch, no filesystem.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Optional

MB = 1_000_000

STEP = "step"
EVAL = "eval"
SAVE = "save"
RENDEZVOUS = "startup:rendezvous"
HEALTH = "startup:health"
VERIFY = "startup:verify"
CONVERT = "startup:convert"
BUILD = "startup:build"
LOAD = "startup:load"


def _rates(events: Iterable[dict[str, Any]], kinds: tuple[str, ...], last: int) -> list[float]:
    """The job's bytes per second (all ranks) of the newest `last` events of `kinds`: their
    `bytes` (all ranks), else the busiest rank's `rank_bytes` x `world_size`, over their seconds
    (until published, for async saves)."""
    found = []
    for e in events:
        if e.get("event") not in kinds or e.get("ok") is False:
            continue
        seconds = float(e.get("total_seconds") or e.get("seconds") or 0)
        nbytes = e.get("bytes") or float(e.get("rank_bytes") or 0) * int(e.get("world_size") or 1)
        if nbytes and seconds > 0:
            found.append(float(nbytes) / seconds)
    return found[-last:]


def measured_write_bps(events: Iterable[dict[str, Any]], last: int = 5) -> Optional[float]:
    """The slowest write rate of the run's last saves (None before its first save)."""
    rates = _rates(events, ("checkpoint_saved",), last)
    return min(rates) if rates else None


def measured_read_bps(events: Iterable[dict[str, Any]], last: int = 5) -> Optional[float]:
    """The median read rate of the run's last verifications and loads (None: never measured)."""
    rates = _rates(events, ("checkpoint_verified", "checkpoint_loaded"), last)
    return statistics.median(rates) if rates else None


@dataclass(frozen=True)
class Deadlines:
    """Seconds without a heartbeat allowed in each phase; `io` scales with the bytes involved."""

    step_s: float
    startup_s: float
    io_floor_s: float
    io_safety: float
    write_bps: float  # the job's: every rank writing at once
    read_bps: float  # the job's: every rank reading at once
    world: int = 1
    write_measured: bool = False
    read_measured: bool = False

    def io(self, nbytes: float, bps: float) -> float:
        """`nbytes` moved by the whole job at `bps`."""
        return self.io_floor_s + max(0.0, float(nbytes)) / bps * self.io_safety

    def save_s(self, rank_bytes: float) -> float:
        """A save writing `rank_bytes` on the busiest rank (every rank writing at once)."""
        return self.io(rank_bytes * self.world, self.write_bps)

    def read_s(self, rank_bytes: float) -> float:
        """A verification or load reading `rank_bytes` on each rank (every rank reading)."""
        return self.io(rank_bytes * self.world, self.read_bps)

    def convert_s(self, nbytes: float) -> float:
        """ds_to_universal: one node reads the whole checkpoint (`nbytes`) and writes it again."""
        return self.io(nbytes, self.read_bps) + self.io(nbytes, self.write_bps)

    def build_s(self, rank_bytes: float) -> float:
        """Building the model and optimizer: `rank_bytes` of state on each rank."""
        return self.startup_s + self.read_s(rank_bytes) - self.io_floor_s

    def fixed(self, phase: str) -> float:
        """The deadline of a phase that has no byte count."""
        return self.step_s if phase in (STEP, EVAL) else self.startup_s

    def summary(self) -> dict[str, Any]:
        """The `deadlines` ledger row: what this attempt allows and where the rates came from."""
        return {
            "step_s": self.step_s,
            "startup_s": self.startup_s,
            "io_floor_s": self.io_floor_s,
            "io_safety": self.io_safety,
            "world_size": self.world,
            "write_mb_per_s": round(self.write_bps / MB, 1),
            "read_mb_per_s": round(self.read_bps / MB, 1),
            "write_rate": "measured" if self.write_measured else "planned",
            "read_rate": "measured" if self.read_measured else "planned",
        }


def from_config(faults: Any, events: Iterable[dict[str, Any]] = (), world: int = 1) -> Deadlines:
    """The deadlines of an attempt on `world` ranks: `faults.*` keys, and the rates this run
    measured when it has any."""
    events = list(events)
    write, read = measured_write_bps(events), measured_read_bps(events)
    return Deadlines(
        step_s=float(faults.hang_timeout_s),
        startup_s=float(faults.startup_timeout_s),
        io_floor_s=float(faults.io_floor_s),
        io_safety=float(faults.io_safety),
        write_bps=write or float(faults.io_write_mb_per_s) * MB,
        read_bps=read or float(faults.io_read_mb_per_s) * MB,
        world=max(1, int(world)),
        write_measured=write is not None,
        read_measured=read is not None,
    )


def listed(manifest: dict[str, Any]) -> int:
    """The bytes of every file a checkpoint's manifest lists."""
    return sum(int(f.get("size", 0)) for f in (manifest.get("files") or {}).values())


def planned_state_bytes(cfg: Any, world: int) -> int:
    """`checkpoint_bytes_per_rank` of a run's config (its model shape and ZeRO stage)."""
    from slurmtrain.planning.shapes import param_count

    return checkpoint_bytes_per_rank(param_count(cfg.model), world, int(cfg.deepspeed.stage))


def checkpoint_bytes_per_rank(params: int, world: int, zero_stage: int) -> int:
    """The most one rank writes in a save (or reads in a load) before the run measured one: the
    fp32 master weights and two Adam moments partitioned over the ranks (12 bytes a parameter),
    plus the module's weights (4 bytes a parameter at most), whole on one rank below ZeRO-3."""
    world = max(1, int(world))
    weights = 4 * params if zero_stage < 3 else 4 * params / world
    return int(12 * params / world + weights)
