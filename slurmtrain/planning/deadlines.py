"""Phase deadlines of an attempt: how long each phase may go without a heartbeat (else: a hang).

One hang window cannot fit both a training step (seconds) and a 66B start-up (minutes of IO), so:
- `step`, `eval`: `faults.hang_timeout_s`;
- start-up phases without bulk IO (rendezvous, health gate, build): `faults.startup_timeout_s`;
- IO phases (verify, convert, load, save): `faults.io_floor_s + seconds x faults.io_safety`, the
  seconds being the bytes the phase moves at the job's rate: the per-node `faults.io_*_mb_per_s`
  x nodes, all ranks at once, so max(total / (rate x nodes), busiest node's bytes / rate).
Once the ledger has measured IO, its rates replace the planned ones: a save is timed by its
busiest rank's measured rate; reads keep the per-node model (a verification's layout is not a
load's). A heartbeat within a phase starts its deadline over. Pure arithmetic.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Union

from slurmtrain.common.events import (
    CheckpointLoaded,
    CheckpointSaved,
    CheckpointVerified,
    Row,
    Started,
)
from slurmtrain.common.events import Deadlines as DeadlinesRow
from slurmtrain.planning.shapes import params_of

if TYPE_CHECKING:
    from slurmtrain.common.schema import FaultsConfig, RootConfig


MB = 1_000_000
# A collective's timeout exceeds the deadline of the phase it waits in by this margin, so the
# watchdog always fires first (compute/distributed.py states the rule; validation checks it).
MARGIN_S, MARGIN_FRACTION = 120.0, 0.1

STEP = "step"
EVAL = "eval"
SAVE = "save"
RENDEZVOUS = "startup:rendezvous"
HEALTH = "startup:health"
VERIFY = "startup:verify"
CONVERT = "startup:convert"
BUILD = "startup:build"
LOAD = "startup:load"

IoRow = Union[CheckpointSaved, CheckpointVerified, CheckpointLoaded]
WRITES: tuple[type[IoRow], ...] = (CheckpointSaved,)
READS: tuple[type[IoRow], ...] = (CheckpointVerified, CheckpointLoaded)


@dataclass(frozen=True)
class Moved:
    """The bytes one IO phase moves: on its busiest rank, its busiest node, and in all."""

    rank: float
    node: float
    total: float


@dataclass(frozen=True)
class Layout:
    """What each IO phase of a checkpoint moves (`layout`)."""

    save: Moved
    verify: Moved
    load: Moved
    convert: Moved


def layout(params: int, world: int, per_node: int, zero_stage: int, weight_bytes: int) -> Layout:
    """A checkpoint's bytes per phase. Every rank holds its partition of the fp32 master weights
    and two Adam moments (12 bytes a parameter over the ranks); under ZeRO-1/2 the module file
    holds no weights (compute/checkpoint/module_states.py: loads rebuild them from the fp32
    partitions); without ZeRO rank 0 writes the module's weights (`weight_bytes` a parameter) once
    and every rank reads that file at load; under ZeRO-3 the weights are partitioned too."""
    world, per_node = max(1, int(world)), max(1, min(int(per_node), int(world)))
    shard = 12 * params / world + (weight_bytes * params / world if zero_stage >= 3 else 0)
    module = weight_bytes * params if zero_stage == 0 else 0  # ZeRO-1/2: rebuilt from fp32
    written = Moved(shard + module, per_node * shard + module, world * shard + module)
    read = Moved(shard + module, per_node * (shard + module), world * (shard + module))
    # verify: each rank checksums its share of the files (the module file is one rank's share)
    return Layout(written, written, read, written)


Bytes = Union[float, Moved]


def _moved(nbytes: Bytes, world: int, per_node: int) -> Moved:
    """A rank's byte count alone (the compute side's calls): its node's ranks move as much."""
    if isinstance(nbytes, Moved):
        return nbytes
    b = max(0.0, float(nbytes))
    return Moved(b, b * per_node, b * world)


def _nodes(e: Row) -> int:
    return max(1, len(e.nodes))


def _measured(e: IoRow) -> tuple[float, float, float]:
    """(seconds, busiest rank's bytes, bytes in all) of one save, verification or load: until
    published for async saves; all ranks' bytes, else the busiest rank's x `world_size`."""
    seconds = e.seconds or 0.0
    if isinstance(e, CheckpointSaved):
        seconds = e.total_seconds or seconds
    rank = float(e.rank_bytes or 0)
    nbytes = None if isinstance(e, CheckpointLoaded) else e.bytes
    return seconds, rank, float(nbytes or rank * (e.world_size or 1))


def _rates(
    events: Iterable[Row], kinds: tuple[type[IoRow], ...], last: int
) -> list[tuple[float, Optional[float]]]:
    """(per-node rate, busiest rank's rate or None) of the newest `last` rows of `kinds` (a
    failed verification left out): their bytes over their nodes and seconds (`_measured`)."""
    found = []
    for e in events:
        if not isinstance(e, kinds) or (isinstance(e, CheckpointVerified) and e.ok is False):
            continue
        seconds, rank, nbytes = _measured(e)
        if nbytes and seconds > 0:
            found.append((nbytes / seconds / _nodes(e), rank / seconds if rank else None))
    return found[-last:]


def measured_write_bps(events: Iterable[Row], last: int = 5) -> Optional[float]:
    """The slowest per-node write rate of the run's last saves (None before its first save)."""
    rates = _rates(events, WRITES, last)
    return min(r for r, _ in rates) if rates else None


def measured_read_bps(events: Iterable[Row], last: int = 5) -> Optional[float]:
    """The median per-node read rate of the run's last verifications and loads (None: never)."""
    rates = _rates(events, READS, last)
    return statistics.median(r for r, _ in rates) if rates else None


def _slowest_rank_bps(events: list[Row]) -> Optional[float]:
    """The slowest busiest-rank write rate of the run's last saves (None: never measured)."""
    rates = [r for _, r in _rates(events, WRITES, 5) if r]
    return min(rates) if rates else None


@dataclass(frozen=True)
class Deadlines:
    """Seconds without a heartbeat allowed in each phase; `io` scales with the bytes involved."""

    step_s: float
    startup_s: float
    io_floor_s: float
    io_safety: float
    write_bps: float  # per node (the job's is this x nodes)
    read_bps: float  # per node
    world: int = 1
    write_measured: bool = False
    read_measured: bool = False
    nodes: int = 1
    write_rank_bps: Optional[float] = None  # measured: a save's busiest rank's bytes per second

    @property
    def per_node(self) -> int:
        return max(1, math.ceil(self.world / max(1, self.nodes)))

    def seconds(self, nbytes: Bytes, write: bool) -> float:
        """Expected seconds of an IO phase moving `nbytes` (a Moved, or a rank's bytes)."""
        moved = _moved(nbytes, self.world, self.per_node)
        if write and self.write_rank_bps:  # as long as the last saves took for these bytes
            return moved.rank / self.write_rank_bps
        bps = self.write_bps if write else self.read_bps
        return max(moved.total / (bps * max(1, self.nodes)), moved.node / bps)

    def io(self, nbytes: float, bps: float) -> float:
        """`nbytes` moved through one node at `bps`."""
        return self.io_floor_s + max(0.0, float(nbytes)) / bps * self.io_safety

    def save_s(self, nbytes: Bytes) -> float:
        """A save: every rank writing its share at once (`nbytes`: a Moved, or the busiest rank's
        bytes, its node's ranks taken to write as much)."""
        return self.io_floor_s + self.seconds(nbytes, True) * self.io_safety

    def read_s(self, nbytes: Bytes) -> float:
        """A verification or load: every rank reading its share at once."""
        return self.io_floor_s + self.seconds(nbytes, False) * self.io_safety

    def convert_s(self, nbytes: float) -> float:
        """ds_to_universal: one node reads the whole checkpoint (`nbytes`) and writes it again."""
        return self.io(nbytes, self.read_bps) + self.io(nbytes, self.write_bps)

    def build_s(self, rank_bytes: float = 0.0) -> float:
        """Building the model and optimizer: memory, no bulk IO (the load is its own phase)."""
        return self.startup_s

    def fixed(self, phase: str) -> float:
        """The deadline of a phase that has no byte count."""
        return self.step_s if phase in (STEP, EVAL) else self.startup_s

    def row(self) -> DeadlinesRow:
        """The ledger row: what this attempt allows and where the rates came from."""
        return DeadlinesRow(
            step_s=self.step_s,
            startup_s=self.startup_s,
            io_floor_s=self.io_floor_s,
            io_safety=self.io_safety,
            world_size=self.world,
            node_count=self.nodes,  # not `nodes`: every ledger row has that list
            write_mb_per_s=round(self.write_bps / MB, 1),  # per node
            read_mb_per_s=round(self.read_bps / MB, 1),
            write_rate="measured" if self.write_measured else "planned",
            read_rate="measured" if self.read_measured else "planned",
        )


def _attempt_nodes(events: list[Row], world: int) -> int:
    """The nodes of this attempt: its `Started` row (the newest of this world size); 1 when
    unknown, which overestimates a node's bytes (a longer deadline, never a false hang)."""
    for e in reversed(events):
        if isinstance(e, Started) and (e.world_size or 0) == world:
            return _nodes(e)
    return 1


def from_config(
    faults: FaultsConfig,
    events: Iterable[Row] = (),
    world: int = 1,
    nodes: Optional[int] = None,
) -> Deadlines:
    """The deadlines of an attempt on `world` ranks over `nodes` nodes (None: from the ledger's
    `Started` row): `faults.*` keys, and the rates this run measured when it has any."""
    events = list(events)
    write, read = measured_write_bps(events), measured_read_bps(events)
    world = max(1, int(world))
    return Deadlines(
        step_s=float(faults.hang_timeout_s),
        startup_s=float(faults.startup_timeout_s),
        io_floor_s=float(faults.io_floor_s),
        io_safety=float(faults.io_safety),
        write_bps=write or float(faults.io_write_mb_per_s) * MB,
        read_bps=read or float(faults.io_read_mb_per_s) * MB,
        world=world,
        write_measured=write is not None,
        read_measured=read is not None,
        nodes=max(1, min(world, int(nodes) if nodes else _attempt_nodes(events, world))),
        write_rank_bps=_slowest_rank_bps(events),
    )


def listed(manifest: Mapping[str, object]) -> int:
    """The bytes of every file a checkpoint's manifest lists."""
    files = manifest.get("files")
    entries = files.values() if isinstance(files, dict) else ()
    return sum(int(f.get("size", 0)) for f in entries if isinstance(f, dict))


def weight_bytes(dtype: str) -> int:
    """Bytes a parameter of the module's weights takes in a checkpoint (its training dtype)."""
    return 4 if dtype == "fp32" else 2


def config_layout(cfg: RootConfig, world: int, nodes: int) -> Layout:
    """`layout` of a run's config (model shape, ZeRO stage, dtype) on `world` ranks, `nodes` nodes."""
    gpus = cfg.gpus_per_node if isinstance(cfg.gpus_per_node, int) else 0
    dtype = str(cfg.deepspeed.dtype)
    if dtype == "auto":
        dtype = "bf16" if gpus > 0 else "fp32"
    world = max(1, int(world))
    per_node = math.ceil(world / max(1, min(int(nodes), world)))
    return layout(params_of(cfg), world, per_node, int(cfg.deepspeed.stage), weight_bytes(dtype))


def planned_save(cfg: RootConfig, world: int, nodes: int) -> Moved:
    """What a save of this run moves on `nodes` nodes: the trainer's deadline before its first
    save (`Deadlines.save_s` takes it as is)."""
    return config_layout(cfg, world, nodes).save


def planned_state_bytes(cfg: RootConfig, world: int) -> int:
    """`checkpoint_bytes_per_rank` of a run's config (its model shape, ZeRO stage and dtype)."""
    return int(config_layout(cfg, world, 1).save.rank)


def checkpoint_bytes_per_rank(params: int, world: int, zero_stage: int, weights: int = 4) -> int:
    """The most one rank writes in a save (or reads in a load) before the run measured one: the
    fp32 master weights and two Adam moments partitioned over the ranks (12 bytes a parameter),
    plus, without ZeRO, the module's weights (`weights` bytes a parameter) whole on one rank."""
    return int(layout(params, world, 1, zero_stage, weights).save.rank)
