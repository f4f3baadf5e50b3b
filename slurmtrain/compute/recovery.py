"""The Trainer's two ways back to a saved state: loading a checkpoint that may fail, and rolling
back after a divergence.

A checkpoint can validate and still fail to load (bytes DeepSpeed rejects behind a truthful
manifest); retrying it would crash every attempt, so the ranks agree on the failure, rank 0 records
`checkpoint_unloadable` and marks it (select.py never picks it again), and the previous valid one
loads in the same attempt. A rollback walks back the same way; after a repeated divergence it starts
from a checkpoint older than the previous rollback's target (divergence.deeper_than).
Every function here is collective.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Protocol

from slurmtrain.common import events, ledger
from slurmtrain.common.checkpoint_format import Manifest, Resume, SavedPosition
from slurmtrain.common.events import FailureClass
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig
from slurmtrain.compute.checkpoint.rng import RngState, set_rng_state
from slurmtrain.compute.context import Attempt, RankContext
from slurmtrain.compute.distributed import broadcast

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

    from slurmtrain.compute.checkpoint.manager import Checkpointer
    from slurmtrain.compute.data import Sampler
    from slurmtrain.compute.divergence import Divergence, Plan
    from slurmtrain.compute.faults.watchdog import Watchdog
    from slurmtrain.planning.deadlines import Deadlines


class Resuming(Protocol):
    """The Trainer's state these functions read and move (compute/trainer.py)."""

    cfg: RootConfig
    run: RunDir
    ctx: RankContext
    attempt: Attempt
    rank: int
    world: int
    watchdog: Watchdog
    deadlines: Deadlines
    engine: DeepSpeedEngine
    checkpointer: Checkpointer
    sampler: Sampler
    found: Resume
    load_dir: Optional[Path]
    same_world: bool
    start_step: int
    stop: Optional[tuple[str, str]]

    def universal(self, found: Resume) -> Path: ...


def data_skip(t: Resuming, manifest: Manifest) -> int:
    """The sampler offset of a checkpoint (and of a rollback that returned to it)."""
    from slurmtrain.compute.divergence import resumed_skip

    position = manifest.get("data_position")
    own = int(position.get("skipped_samples", 0)) if isinstance(position, dict) else 0
    rows = t.attempt.rows if t.rank == 0 else []  # the run tier, read at the start
    step = manifest["step"]
    assert isinstance(step, (int, str))  # a manifest's step: an int in JSON
    return int(broadcast(resumed_skip(own, int(step), ledger.rollbacks(rows))))


def try_load(
    t: Resuming, directory: Path, restore_rng: bool = True, manifest: Optional[Manifest] = None
) -> tuple[Optional[str], Optional[RngState]]:
    """Collective: (None, the RNG state if one was restored) when every rank loaded `directory`,
    else (the first failing rank's error, None). Caught on every rank and agreed (one all-reduce of a flag; the
    errors are gathered only after a failure), so all ranks walk back together; the next load
    replaces whatever the failed one had put in the engine."""
    import torch
    import torch.distributed as dist

    rng: Optional[RngState] = None
    error: Optional[str] = None
    try:
        rng = t.checkpointer.load(t.engine, directory, restore_rng, manifest)
    except Exception as err:  # noqa: BLE001  whatever DeepSpeed or torch.load raise
        error = f"{type(err).__name__}: {err}"[:2000]
    flag = torch.tensor([error is not None], dtype=torch.int32, device=t.ctx.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if not int(flag.item()):
        return None, rng
    errors: list[Optional[str]] = [None] * t.world
    dist.all_gather_object(errors, error)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    rank, first = failed[0]
    more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
    return f"{first} (rank {rank}{more})", None


def mark_unloadable(t: Resuming, found: Resume, error: str) -> None:
    """Rank 0: the ledger row and the marker that keeps every later attempt off `found`."""
    from slurmtrain.compute.checkpoint import select

    assert found.path is not None  # only a found checkpoint fails to load
    step = int(found.manifest.get("step", found.path.name.split("_")[1]))
    t.attempt.record(events.CheckpointUnloadable(step=step, path=str(found.path), error=error))
    if t.rank != 0:
        return
    try:
        select.mark_unloadable(
            found.path, error, job_id=t.ctx.where.job_id, attempt=t.attempt.number
        )
    except OSError as err:  # the row still says it; this attempt will not pick it again
        print(f"slurmtrain: could not mark {found.path} unloadable: {err}", file=sys.stderr)
    print(
        f"slurmtrain: checkpoint {found.path.name} validates but does not load ({error}); "
        f"marked, trying the previous one",
        file=sys.stderr,
    )


def load_resumed(t: Resuming) -> bool:
    """Load `t.found` (built for in `t.build`) and its RNG state, walking back past checkpoints
    that fail to load. False, with `t.stop` set, when none is left to load."""
    from slurmtrain.compute.checkpoint import verify

    while True:
        assert t.load_dir is not None and t.found.path is not None  # a chosen checkpoint
        # the chosen checkpoint's manifest, broadcast by rank 0 (not its universal form's)
        manifest = t.found.manifest if t.load_dir == t.found.path else None
        error, rng = try_load(t, t.load_dir, t.same_world, manifest)
        if error is None:
            set_rng_state(rng)
            return True
        mark_unloadable(t, t.found, error)
        found = verify.newest_valid(
            t.cfg, t.run, t.rank, t.world, t.watchdog, t.deadlines, t.attempt.record
        )
        if found.path is None:
            t.stop = (
                FailureClass.checkpoint_unreadable,
                f"{t.found.path.name} failed to load ({error}) and no older checkpoint validates; "
                f"pass resume=none to start from step 0",
            )
            return False
        other_world = int(found.manifest.get("world_size", t.world)) != t.world
        if other_world == t.same_world:
            # The engine was built for the other kind (plain vs universal load): the next attempt
            # builds it for this one, skipping the marked checkpoint.
            raise RuntimeError(
                f"{t.found.path.name} failed to load ({error}); the next attempt starts from "
                f"{found.path.name}, which needs an engine built for another world size"
            )
        t.found = found
        t.load_dir = t.universal(found) if other_world else found.path


def rollback(t: Resuming, d: Divergence) -> bool:
    """Reload a valid checkpoint in this process and skip the data window that diverged; False
    (and `t.stop`) when the run must stop `diverged` instead. After a repeated divergence the
    checkpoint is older than the previous rollback's; the target is never pruned afterwards."""
    from slurmtrain.compute import divergence
    from slurmtrain.compute.checkpoint import verify

    cfg = t.cfg
    max_steps, gbs = int(cfg.train.max_steps or 0), int(cfg.train.global_batch_size or 0)
    t.checkpointer.settle()  # an async save in flight is published (or failed) first
    previous = ledger.rollbacks(t.attempt.rows) if t.rank == 0 else []  # every attempt's
    before = broadcast(divergence.deeper_than(d, previous, cfg.faults) if t.rank == 0 else None)
    while True:
        found = verify.newest_valid(
            cfg, t.run, t.rank, t.world, t.watchdog, t.deadlines, t.attempt.record, before
        )
        plan: Optional[Plan] = None
        if t.rank == 0:
            manifest = found.manifest
            step = int(manifest["step"]) if found.path is not None else None
            if step is not None and int(manifest.get("world_size", t.world)) != t.world:
                step = None  # written by another world size: its universal form is not loaded
            own = int((manifest.get("data_position") or SavedPosition()).get("skipped_samples", 0))
            plan = divergence.plan_rollback(d, step, own, previous, cfg.faults, max_steps, gbs)
        plan = broadcast(plan)
        assert plan is not None  # rank 0 planned it
        if plan.stop is not None:
            t.stop = (FailureClass.diverged, plan.stop)
            t.attempt.step = d.step
            return False
        t0 = time.time()
        assert found.path is not None  # a plan without a stop has a checkpoint to load
        error, rng = try_load(t, found.path, manifest=found.manifest)
        if error is None:
            break
        mark_unloadable(t, found, error)  # and look again: newest_valid skips it now
    set_rng_state(rng)
    _rolled_back(t, d, found, plan, time.time() - t0)
    return True


def _rolled_back(t: Resuming, d: Divergence, found: Resume, plan: Plan, seconds: float) -> None:
    from slurmtrain.compute import divergence

    cfg = t.cfg
    gbs = int(cfg.train.global_batch_size or 0)
    loss = divergence.finite_or_text(d.loss)
    t.start_step, t.sampler.skip = plan.to_step, plan.skip_samples
    t.attempt.step = plan.to_step
    t.checkpointer.protect.add(plan.to_step)  # a later repeat may need it again
    t.watchdog.beat("rollback")
    t.attempt.record(
        events.Rollback(
            step=d.step,
            loss=d.loss,  # NaN/inf: the row writes them as text
            reason=d.why,
            to_step=plan.to_step,
            path=str(found.path),
            skipped_steps=plan.skip_steps,
            skipped_samples=plan.skip_steps * gbs,
            data_skip=plan.skip_samples,
            number=plan.number,
            seconds=seconds,
        )
    )
    if t.rank == 0:
        print(
            f"slurmtrain: loss {loss} at step {d.step} ({d.why}): rolled back to step "
            f"{plan.to_step}, skipping {plan.skip_steps} steps of data "
            f"(rollback {plan.number} of faults.max_rollback={cfg.faults.max_rollback})",
            file=sys.stderr,
        )
