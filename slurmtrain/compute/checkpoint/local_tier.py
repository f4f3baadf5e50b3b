"""The node-local checkpoint tier: every `checkpoint.local_every_steps` steps, each node's ranks'
shards in node-local storage with a manifest and checksums, plus a copy on the next node (a ring).

Layout under the node's `local_dir`: `own/step_N/` (this node's ranks' files and the shared files
every rank reads, sealed like the shared tier) and `buddy/<node>/step_N/` (the previous node's
`own/step_N/`, received through the process group: checkpoint/buddy.py). Only the newest `KEEP`
steps are kept. The shared tier stays the durable one; local saves never write the ledger's
`checkpoint_saved` (export, sample and the budgets read that). Collective: every rank calls.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

from slurmtrain.common import ownership
from slurmtrain.common.checkpoint_format import OWNER, seal, step_dirs, tag
from slurmtrain.common.schema import CheckpointConfig
from slurmtrain.compute.checkpoint import buddy
from slurmtrain.planning.deadlines import Moved, listed

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

    from slurmtrain.compute.checkpoint.manager import Checkpointer, Meta
    from slurmtrain.compute.checkpoint.rng import RngState

KEEP = 2  # local steps kept per tier: the newest, and one more while the next is written
# Tests: ranks per simulated node on one host (each node then gets its own `{node}` directory).
RANKS_PER_NODE_ENV = "SLURMTRAIN_LOCAL_RANKS_PER_NODE"
OWN, BUDDY = "own", "buddy"


def _log(line: str) -> None:
    print(f"slurmtrain: {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Nodes:
    """Which node each rank is on: `leads[r]` the lowest rank of rank r's node."""

    leads: list[int]
    rank: int

    @property
    def order(self) -> list[int]:
        return sorted(set(self.leads))

    @property
    def count(self) -> int:
        return len(self.order)

    def node_of(self, rank: int) -> int:
        return self.order.index(self.leads[rank])

    @property
    def node(self) -> int:
        return self.node_of(self.rank)

    @property
    def is_lead(self) -> bool:
        return self.leads[self.rank] == self.rank

    def ranks(self, node: int) -> list[int]:
        lead = self.order[node]
        return [r for r, lead_r in enumerate(self.leads) if lead_r == lead]


def nodes(rank: int, world: int) -> Nodes:
    """Collective (one all_gather of host names), or the test override without one."""
    per = os.environ.get(RANKS_PER_NODE_ENV)
    if per:
        k = max(1, int(per))
        return Nodes([r - r % k for r in range(world)], rank)
    from slurmtrain.compute.distributed import host_leads

    return Nodes(host_leads(), rank)


def run_key(run_path: Path) -> str:
    """The run's own name under a shared node-local root: its name and its path's hash."""
    return f"{run_path.name}-{hashlib.sha256(str(run_path.resolve()).encode()).hexdigest()[:12]}"


def local_root(cfg: CheckpointConfig, run_path: Path, node: int) -> Path:
    """`checkpoint.local_dir` (its `{node}` filled), or `$SLURM_TMPDIR`|/dev/shm's per-user 0700
    `slurmtrain-<uid>` directory; the run's own subdirectory either way."""
    if cfg.local_dir:
        base = Path(str(cfg.local_dir).replace("{node}", str(node)))
    else:
        tmp = os.environ.get("SLURM_TMPDIR") or "/dev/shm"
        base = Path(tmp) / f"slurmtrain-{os.getuid()}"
    ownership.make_dir(base, 0o700, "node-local checkpoint directory")
    root = base / run_key(run_path)
    ownership.make_dir(root, 0o700, "node-local checkpoint directory")
    return root


def prune(root: Path) -> None:
    for old in step_dirs(root)[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


def forget(root: Path) -> None:
    """resume=none|step_N applied: local copies of the discarded history must never load."""
    shutil.rmtree(root / OWN, ignore_errors=True)
    shutil.rmtree(root / BUDDY, ignore_errors=True)


class LocalTier:
    """Saves every `every` steps to this node's `root`; the buddy copy goes to the next node."""

    def __init__(
        self, cfg: CheckpointConfig, where: Nodes, root: Path, checkpointer: Checkpointer
    ) -> None:
        self.every, self.verify = int(cfg.local_every_steps), str(cfg.verify)
        self.where, self.root, self.checkpointer = where, root, checkpointer
        self.own = root / OWN
        self.own.mkdir(exist_ok=True)

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def save(self, engine: DeepSpeedEngine, step: int, meta: Meta, rng: RngState) -> bool:
        """Collective: this step's local copy on every node and its buddy copy; False (and one
        warning line) when some node lacks the space, or a write failed: nothing half-written
        is ever a candidate (`step_N.tmp` until sealed)."""
        import time

        import torch.distributed as dist

        self.checkpointer.settle()  # the shared tier's async write: the writer is free again
        t0 = time.perf_counter()
        short = self._short_of_space()
        flags: list[Optional[str]] = [None] * dist.get_world_size()
        dist.all_gather_object(flags, short)
        if any(flags):
            if self.where.rank == 0:
                _log(f"local checkpoint {tag(step)} skipped: {next(f for f in flags if f)}")
            return False
        tmp = self.own / f"{tag(step)}.tmp"
        if self.where.is_lead:
            shutil.rmtree(tmp, ignore_errors=True)
        dist.barrier()
        error = self._write(engine, step, meta, rng, tmp)
        errors: list[Optional[str]] = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
        written = time.perf_counter()
        reports = self._reports(error)
        errors += [
            f"rank {r.get('rank')}: {r.get('error')}" for r in reports if r.get("ok") is False
        ]
        self._share(tmp)
        sealed = self._seal(tmp, step, meta, reports) if not any(errors) else "a rank failed"
        outcomes: list[Optional[str]] = [None] * dist.get_world_size()
        dist.all_gather_object(outcomes, sealed)
        failed = next((e for e in [*errors, *outcomes] if e), None)
        if failed is not None:
            if self.where.is_lead:
                shutil.rmtree(tmp, ignore_errors=True)
            if self.where.rank == 0:
                _log(f"local checkpoint {tag(step)} NOT saved: {failed}")
            return False
        copying = time.perf_counter()
        self._buddy_copy(step)
        dist.barrier()
        if self.where.rank == 0:  # bench/local_tier_drill.py reads the fixed part from here
            done = time.perf_counter()
            _log(
                f"local checkpoint {tag(step)} saved in {done - t0:.3f} s: write "
                f"{written - t0:.3f} s (space check included), buddy copy {done - copying:.3f} s, "
                f"the rest (shared files, manifest, seal, agreement) {copying - written:.3f} s; "
                f"{sum(listed(r) for r in reports) / 1e6 / self.where.count:.1f} MB a node"
            )
        return True

    def drop(self) -> None:
        """Collective, once the run finished: this run's local copies go (RAM, with /dev/shm)."""
        import torch.distributed as dist

        dist.barrier()
        if self.where.is_lead:
            shutil.rmtree(self.root, ignore_errors=True)

    def _short_of_space(self) -> Optional[str]:
        """Node leads: why this node cannot hold its ranks' shards twice (own + buddy's), or None."""
        if not self.where.is_lead:
            return None
        need = (
            2 * saved_bytes(self.checkpointer.save_bytes) * len(self.where.ranks(self.where.node))
        )
        free = shutil.disk_usage(self.own).free
        if free < need:
            return f"{self.own}: {free >> 20} MiB free, {need >> 20} MiB needed"
        return None

    def _write(
        self, engine: DeepSpeedEngine, step: int, meta: Meta, rng: RngState, tmp: Path
    ) -> Optional[str]:
        import torch

        writer = self.checkpointer.writer
        rng_path = str(tmp / f"rng_rank{self.where.rank}.pt")
        try:
            if writer is not None:
                writer.begin(step, str(tmp), False)
            engine.save_checkpoint(
                str(self.own), tag=tmp.name, client_state={"meta": meta}, save_latest=False
            )
            if writer is not None:
                writer.save(rng, rng_path)
                writer.host_copy_done()
            else:
                torch.save(rng, rng_path)
        except OSError as err:
            return f"rank {self.where.rank}: {type(err).__name__}: {err}"
        return None

    def _reports(self, error: Optional[str]) -> list[dict[str, object]]:
        """Every rank's written files (name -> size, checksum), gathered once."""
        import torch.distributed as dist

        writer = self.checkpointer.writer
        mine: dict[str, object] = {"files": {}}
        if writer is not None and error is None:
            mine = dict(writer.report(self.where.rank))
        gathered: list[dict[str, object]] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, mine)
        return gathered

    def _share(self, tmp: Path) -> None:
        """Rank 0 sends the files only it wrote (model states: every rank reads them) to every
        other node's lead, which adds them to its `.tmp` copy."""
        if self.where.count < 2:
            return
        if self.where.rank == 0:
            names = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
            files = buddy.read_tree(tmp, [n for n in names if not OWNER.search(n)])
            for lead in self.where.order[1:]:
                buddy.send(files, lead)
        elif self.where.is_lead:
            got = buddy.recv(0)
            assert isinstance(got, dict)
            buddy.add_files(got, tmp)

    def _seal(
        self, tmp: Path, step: int, meta: Meta, reports: list[dict[str, object]]
    ) -> Optional[str]:
        """Node leads: the manifest of what is on this node, then the rename; None when sealed."""
        if not self.where.is_lead:
            return None
        present = {}
        for report in reports:
            files = report.get("files")
            if isinstance(files, dict):
                present.update({n: e for n, e in files.items() if (tmp / n).is_file()})
        try:
            seal(
                tmp, self.own / tag(step), {"step": step, **meta}, self.verify, [{"files": present}]
            )
        except OSError as err:
            return f"node {self.where.node}: {type(err).__name__}: {err}"
        prune(self.own)
        return None

    def _buddy_copy(self, step: int) -> None:
        """Node leads: this node's sealed copy to the next node; the previous node's kept here."""
        where = self.where
        if where.count < 2 or not where.is_lead:
            return
        files = buddy.read_tree(self.own / tag(step))
        got = buddy.ring(where.node, where.count, where.order, files)
        assert isinstance(got, dict)
        prev = (where.node - 1) % where.count
        held = self.root / BUDDY / str(prev)
        held.mkdir(parents=True, exist_ok=True)
        buddy.write_tree(got, held / tag(step))
        prune(held)


def open_tier(
    cfg: CheckpointConfig, run_path: Path, rank: int, world: int, checkpointer: Checkpointer
) -> Optional[LocalTier]:
    """Collective: the tier when `checkpoint.local_every_steps` is set, else None."""
    if int(cfg.local_every_steps) <= 0:
        return None
    where = nodes(rank, world)
    return LocalTier(cfg, where, local_root(cfg, run_path, where.node), checkpointer)


def saved_bytes(planned: Union[int, Moved]) -> int:
    return int(planned.rank if isinstance(planned, Moved) else planned)
