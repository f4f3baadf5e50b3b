"""One run, one job: rank 0 claims the run before training, or refuses while another job holds it.

The ledger's newest `submitted`/`started` event names the owner. A job that is not the owner
trains only once Slurm says the owner is gone; meanwhile it records `duplicate_refused` and exits
with EXIT_DUPLICATE, before touching checkpoints. The check and the `started` event are made under
the run's lock, so two jobs starting at once cannot both see the run free; when Slurm cannot be
asked, the attempt fails (class crash) instead of guessing.

A run cancelled with `cli cancel` does not train: a job the cancel named, or one queued before it,
records `attempt_ended{cancelled}` and exits. A submission after the cancel lifts it (the same
command again, or a hand `sbatch`, recorded at start as `submitted` by=hand).
"""

from __future__ import annotations

import contextlib
import os
import sys
from datetime import datetime
from typing import Callable, Mapping, Optional, Sequence

from slurmtrain.common import errors, events, ledger
from slurmtrain.common.events import FailureClass, Row, Rows
from slurmtrain.common.liveness import slurm_job_alive
from slurmtrain.common.rundir import RunDir
from slurmtrain.compute.context import relaunch_count, restart_count
from slurmtrain.compute.distributed import Placement

FREE, DUPLICATE, UNKNOWN = "free", "duplicate", "unknown"
CANCELLED, LIFTED = "cancel_stands", "cancel_lifted"  # cancelled_start's verdicts


def my_job_ids(env: Mapping[str, str] = os.environ) -> set[str]:
    """Every name this job goes by in the ledger: its id, and `ARRAYID_TASK` in a job array."""
    ids = {env["SLURM_JOB_ID"]} if env.get("SLURM_JOB_ID") else set()
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        ids.add(f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}")
    return ids


def under_slurm(env: Mapping[str, str] = os.environ) -> bool:
    return bool(env.get("SLURM_JOB_ID")) and "SUBMITIT_LOCAL_JOB_ID" not in env


def check(
    run: RunDir, mine: set[str], rows: Optional[Rows] = None
) -> tuple[str, Optional[events.Submitted | events.Started]]:
    """(FREE | DUPLICATE | UNKNOWN, the owner's ledger row). Call under run.locked().
    `rows`: the run tier when the caller has read it (owners live there: `Submitted`,
    `Started`; no rank's row is read)."""
    rows = run.run_events() if rows is None else rows
    # A job queued to start after this one (smoke chain: `after`; a time-limit restart) waits for
    # it to end: it is the next owner, not a competitor.
    own = ledger.owner([e for e in rows if not _queued_after(e, mine)])
    if own is None or str(own.job_id) in mine or own.executor == "local":
        return FREE, own
    alive = slurm_job_alive(str(own.job_id))
    if alive is None:
        alive = slurm_job_alive(str(own.job_id))  # once more: a busy controller
    if alive is False:
        return FREE, own
    return (DUPLICATE if alive else UNKNOWN), own


def _queued_after(row: Row, mine: set[str]) -> bool:
    return isinstance(row, events.Submitted) and row.after is not None and row.after in mine


def submitted_by_user(row: Row) -> bool:
    """A `Submitted` row of a user's submission (login node, or a hand job recorded at its start),
    not a supervisor's resubmission (`requeue_of`). (common/windows.py's
    user_submission(rows, job_id) answers the neighbouring question: a job id slurmtrain never
    recorded as submitted.)"""
    return isinstance(row, events.Submitted) and not row.requeue_of


def cancelled_start(
    rows: Sequence[Row], mine: set[str], submit_time: Callable[[], Optional[float]]
) -> Optional[str]:
    """Whether a `cli cancel` stands in the way of this start: None (it does not), CANCELLED (do
    not train), LIFTED (a hand job submitted after the cancel: a user submission, to record).
    `submit_time`: Slurm's SubmitTime of this job (epoch s; None: unknown), asked only for a job
    the ledger does not know: O(1) Slurm calls per start."""
    cancels = [e for e in rows if isinstance(e, events.Cancelled)]
    if not cancels:
        return None
    at = cancels[-1].time
    if mine & set(cancels[-1].job_ids):
        return CANCELLED
    if any(submitted_by_user(e) and e.time >= at for e in rows):
        return None  # the user submitted the run again after the cancel
    if any(isinstance(e, events.Submitted) and str(e.job_id) in mine for e in rows):
        return CANCELLED  # queued before the cancel, or a resubmission racing it
    when = submit_time()
    if when is None:  # fail closed: a run the user stopped does not start on a guess
        return CANCELLED
    # SubmitTime has whole seconds: a job submitted in the cancel's own second may have come
    # before it (an untagged job the cancel missed), so only a later second lifts: fail closed.
    return LIFTED if when >= int(at) + 1 else CANCELLED


def submit_time(job_id: str) -> Optional[float]:
    """Slurm's SubmitTime of a job (the controller's local time), as epoch seconds; None when
    Slurm cannot say."""
    from slurmtrain.common import slurm_cmd
    from slurmtrain.common.slurm_text import SlurmError

    try:
        text = slurm_cmd.job_info(job_id)["SubmitTime"]
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except (SlurmError, KeyError, ValueError, IndexError):
        return None


def honour_cancel(
    run: RunDir,
    mine: set[str],
    rows: Rows,
    *,
    job_id: Optional[str],
    node: str,
    restart: int,
    relaunch: int,
) -> bool:
    """Rank 0, under the run's lock, once the run is free: False when this job may train (a hand
    submission after the cancel is recorded first), True when a cancel stops it (recorded as
    `attempt_ended{cancelled}`: the supervisor neither restarts nor resubmits it). The keywords
    place this start."""
    job = str(job_id)
    verdict = cancelled_start(rows, mine, lambda: submit_time(job))
    if verdict is None:
        return False
    if verdict == LIFTED:
        hand = events.Submitted(executor="slurm", fingerprint=run.path.name, by="hand")
        rows.append(run.record(hand, job_id=job))
        return False
    ended = events.AttemptEnded(cls=FailureClass.cancelled, closed_by="start")
    rows.append(
        run.record(
            ended,
            job_id=job_id,
            attempt=None,
            nodes=[node],
            rank=0,
            node=node,
            restart=restart,
            relaunch=relaunch,
        )
    )
    print(
        f"slurmtrain: job {job} does not train {run.path}: the run was cancelled "
        f"(`cli cancel`) and not submitted again since; submit it again to resume",
        file=sys.stderr,
    )
    return True


def claim(
    run: RunDir, where: Placement, lock: contextlib.ExitStack, rows: events.Rows
) -> Optional[int]:
    """Rank 0: take the run (its lock stays held until `Started` is recorded), or the exit code
    of a job that must not train it. `rows` gets the run tier, read once under the lock (the
    rest of the start reuses it)."""
    if not under_slurm():
        rows += run.run_events()
        return None  # local runs: the login shell's lock and pid check keep them single
    mine = my_job_ids()
    why: Optional[str] = None
    try:
        lock.enter_context(run.locked(timeout=300))
        rows += run.run_events()
        verdict, own = check(run, mine, rows)
    except errors.ConfigError as err:  # the lock stayed busy (RunLocked)
        verdict, own, why = UNKNOWN, None, str(err)
    if verdict == FREE:  # ... unless `cli cancel` stopped the run since
        stop = honour_cancel(
            run,
            mine,
            rows,
            job_id=where.job_id,
            node=where.node,
            restart=restart_count(),
            relaunch=relaunch_count(),
        )
        return 0 if stop else None

    def refuse(row: events.Row) -> None:  # before `started`: placed by job id and counters
        run.record(
            row,
            job_id=where.job_id,
            attempt=None,
            nodes=[where.node],
            rank=0,
            node=where.node,
            restart=restart_count(),
            relaunch=relaunch_count(),
        )

    other = own.job_id if own is not None else None
    if verdict == DUPLICATE:
        refuse(events.DuplicateRefused(owner=other))
        print(
            f"slurmtrain: job {where.job_id} refuses to train {run.path}: job {other} holds it "
            f"and Slurm reports it alive; this job exits without touching the run",
            file=sys.stderr,
        )
        return errors.EXIT_DUPLICATE
    why = why or f"neither squeue nor sacct says whether job {other} is alive"
    refuse(events.Failed(cls=FailureClass.crash, error=f"cannot claim the run: {why}"))
    print(f"slurmtrain: cannot claim {run.path}: {why}", file=sys.stderr)
    return 1
