"""Parallel checkpoint verification: every rank checksums its own files, and the ranks agree.

Rank 0 alone would read the whole checkpoint (terabytes at scale) before training. Instead rank 0
walks the candidates (select.choose: manifest and sizes, cheap) and hands each one that passes to
`check`, which every rank runs together: rank R checksums the files it wrote and will read
(`checkpoint_format.files_for_rank`), beating the watchdog as it reads, and all ranks gather the
verdicts, so each learns the same answer (the first bad file named). Rank 0 records
`checkpoint_verified` (bytes and seconds of the slowest rank: the read rate of later deadlines).
Restart cost flat in node count (bench/restart_ops.py): rank 0 reads each candidate's manifest
once and broadcasts it with the directory (no other rank reads it), and leaves each file's
presence and size to the rank that checksums it (no stat of every rank's files on rank 0).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional, Union

from slurmtrain.common import checkpoint_format, events
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig
from slurmtrain.compute.checkpoint import select
from slurmtrain.compute.distributed import broadcast
from slurmtrain.compute.faults.watchdog import Watchdog
from slurmtrain.planning.deadlines import VERIFY, Deadlines, from_config

Record = Callable[[events.Row], object]  # the attempt's ledger write
Verdict = tuple[Optional[str], int, float, int]  # (reason, bytes, seconds, files) of one rank
Listed = Union[dict[str, checkpoint_format.FileEntry], str]  # a manifest's files, or why none
_NO_MORE: Optional[tuple[str, Listed]] = None  # what `done` sends: the other ranks stop serving


class ParallelVerify:
    """Rank 0 calls `check(directory)` from select.choose (as often as it has candidates) and
    `done()` once; every other rank calls `serve()`, which answers until `done()`."""

    def __init__(
        self,
        rank: int,
        world: int,
        watchdog: Watchdog,
        deadlines: Deadlines,
        record: Record,
    ) -> None:
        self.rank, self.world, self.watchdog = rank, world, watchdog
        self.deadlines, self.record = deadlines, record

    def check(self, directory: Path) -> Optional[str]:
        """Rank 0 reads the manifest once and sends it with the directory: no other rank reads
        it (a restart's shared-tier reads stay flat in node count: bench/restart_ops.py)."""
        try:
            listed: Listed = checkpoint_format.read_manifest(directory).get("files") or {}
        except (OSError, ValueError) as err:
            listed = f"unreadable manifest: {err}"
        broadcast((str(directory), listed))
        return self._verify(directory, listed)

    def done(self) -> None:
        broadcast(_NO_MORE)

    def serve(self) -> None:
        while (sent := broadcast(_NO_MORE)) is not None:
            self._verify(Path(sent[0]), sent[1])

    def _verify(self, directory: Path, listed: Listed) -> Optional[str]:
        import torch.distributed as dist

        t0 = time.time()
        reason = listed if isinstance(listed, str) else None  # rank 0 could not read it
        files = listed if not isinstance(listed, str) else {}
        mine = checkpoint_format.files_for_rank(files, self.rank, self.world) if files else []
        nbytes = sum(int(files[n].get("size", 0)) for n in mine)
        if reason is None:
            what = f"verifying {directory.name}"
            with self.watchdog.during(VERIFY, self.deadlines.read_s(nbytes), what):
                beat = self.watchdog.progress(VERIFY, what)
                reason = checkpoint_format.verify_files(directory, mine, beat, files)
        verdicts: list[Verdict] = [(None, 0, 0.0, 0)] * self.world
        dist.all_gather_object(verdicts, (reason, nbytes, time.time() - t0, len(mine)))
        bad = [(r, v[0]) for r, v in enumerate(verdicts) if v[0] is not None]
        agreed = f"{bad[0][1]} (rank {bad[0][0]})" if bad else None
        verified = events.CheckpointVerified(
            path=str(directory),
            ok=agreed is None,
            reason=agreed,
            world_size=self.world,
            files=sum(v[3] for v in verdicts),
            bytes=sum(v[1] for v in verdicts),
            rank_bytes=max(v[1] for v in verdicts),
            seconds=max(v[2] for v in verdicts),
        )
        self.record(verified)
        return agreed


def choose(
    cfg: RootConfig,
    run: RunDir,
    rank: int,
    world: int,
    watchdog: Watchdog,
    record: Record,
    run_rows: Optional[events.Rows] = None,
) -> tuple[select.Choice, Deadlines]:
    """Collective: this attempt's phase deadlines (rank 0 reads the ledger's measured rates) and
    the checkpoint to start from (select.choose on rank 0, the checksums on every rank).
    `run_rows`: rank 0's run tier when the caller has it (no rank's row is needed here)."""
    if rank == 0 and run_rows is None:  # (a stand-in `run` with events() alone still works)
        run_rows = getattr(run, "run_events", run.events)()
    rows: events.Rows = run_rows if rank == 0 and run_rows is not None else []
    limits = broadcast(from_config(cfg.faults, rows, world) if rank == 0 else None)
    assert limits is not None  # rank 0's
    record(limits.row())
    watchdog.phase(VERIFY, limits.startup_s)
    checks = ParallelVerify(rank, world, watchdog, limits, record)
    full = cfg.checkpoint.verify == "checksum"
    choice: Optional[select.Choice] = None
    if rank == 0:
        try:
            check = checks.check if full else None
            parent = getattr(cfg, "resume_from", None)  # a branch (login/branch.py)
            branch = (str(parent), int(cfg.data.skip_samples)) if parent else None
            choice = select.choose(run.checkpoints, rows, str(cfg.resume), full, check, branch)
        finally:
            checks.done()  # the other ranks stop serving (also when rank 0 failed)
    else:
        checks.serve()
    agreed = broadcast(choice)
    assert agreed is not None  # rank 0's: it returned one or raised
    return agreed, limits


def newest_valid(
    cfg: RootConfig,
    run: RunDir,
    rank: int,
    world: int,
    watchdog: Watchdog,
    deadlines: Deadlines,
    record: Record,
    before: Optional[int] = None,
) -> checkpoint_format.Resume:
    """Collective: the newest checkpoint that validates and is not marked unloadable (a
    rollback's target, or the one tried after a load failed), its files checked by every rank in
    parallel as at start-up, never rank 0 alone under the step's deadline. `before`: only
    checkpoints older than that step (a repeated divergence goes further back)."""
    checks = ParallelVerify(rank, world, watchdog, deadlines, record)
    full = cfg.checkpoint.verify == "checksum"
    loadable = select.loadable(checks.check if full else None, full)

    def candidate(directory: Path) -> Optional[str]:
        if before is not None and int(directory.name.split("_")[1]) >= before:
            return f"not older than step {before}"
        return loadable(directory)

    found: Optional[checkpoint_format.Resume] = None
    if rank == 0:
        try:
            found = checkpoint_format.find_resumable(
                run.checkpoints, full, candidate, check_files=full
            )
            if found.path is None and getattr(cfg, "resume_from", None):  # a branch, unsaved
                found = select.branch_point(
                    str(cfg.resume_from),
                    int(cfg.data.skip_samples),
                    full,
                    checks.check if full else None,
                ).found
        finally:
            checks.done()
    else:
        checks.serve()
    agreed = broadcast(found)
    assert agreed is not None  # rank 0's: it returned one or raised
    return agreed
