"""The run's successor: a pending `--dependency=singleton` copy of job.sbatch kept in the queue
while a Slurm run is alive (faults.successor, on for single Slurm runs), so losing the batch node
or the whole allocation costs one queue wait, not a human.

Why singleton: it releases when every other job of the same name has ended, and a run's jobs carry
a name of their own (`job_name`: st-NAME-FINGERPRINT8), so sweep points and other runs never wait
on each other. The successor is the very job.sbatch (the file submitted is the file resubmitted),
recorded as `successor_queued`, not `submitted`: it is not the run's owner until it starts, so it
never blocks the run lock; when it starts while another job holds the run, that lock refuses it.

`settle` runs in the batch shell at a job's start and end (one squeue, at most one sbatch or
scancel): a run that finished, stopped, paused or was cancelled (`cli cancel`, or a hand scancel
of its job: the attempt ended `cancelled`) has its pending successors cancelled; otherwise one is
queued when none is pending (the successor that starts queues its own). A successor that starts
anyway (its job's batch shell was killed before the end's settle: KillWait after a scancel) finds
the run over and trains nothing (`EXIT_NOT_NEEDED`: the batch script exits 0 before any srun). A
hand `sbatch job.sbatch` is never a recorded successor, so it resumes a run as it always did.

When the batch shell itself starts the next job (time limit, a failure's resubmit, the fallback:
next_job.submit_held), the pending successor *is* that next job (`adopt`): recorded `submitted`
(requeue_of this job) and given the exclusions (`scontrol update`), never a second sbatch. Why
not sbatch a new job and cancel the successor: the trap at the time limit has KillWait (15 s
here) before SIGKILL, and a successor still pending when the job ends races the new job (both
start, one is refused); adopting leaves exactly one next job whatever point the trap dies at.
The successor cannot start before this job ends (same name, singleton), so recording it as the
owner before then keeps the held-recorded-released guarantee without the hold. When no successor
is pending, or the update fails (then the pending ones are cancelled first), a held job is
submitted as before. A requeue (same job id, older than the successor) is not raced: the
successor waits behind it.

Arrays (sweeps) get none: their tasks share the array's name, so a singleton would wait on every
point; one successor per point would need its own script (job.sbatch is per point, the array's
is not). A point restarted by its supervisor runs its own job.sbatch under its own name, and from
then on has a successor like any single run.
"""

from __future__ import annotations

import getpass
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from slurmtrain.common import events, ledger, slurm_cmd, slurm_text
from slurmtrain.common.events import FailureClass, Row
from slurmtrain.common.liveness import ACTIVE_SLURM_STATES
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig, load_run_config
from slurmtrain.common.windows import current_stop

PENDING, CANCELLED = "PENDING", "CANCELLED"  # Slurm's job states
ACTIVE = ACTIVE_SLURM_STATES - {"COMPLETING"}  # a job that lives on (e.g. requeued), not ending
# The batch script's start: this job is a successor of a run that is over; it exits 0 untrained.
# (common/errors.py holds the ranks' and supervisor's codes, 3 to 8.)
EXIT_NOT_NEEDED = 9


def job_name(name: str, run_dir: str | Path) -> str:
    """A run's own Slurm job name: its config name and its fingerprint's first 8 characters."""
    return f"st-{name}-{Path(run_dir).name[:8]}"


def _hand_cancel(e: Row) -> bool:
    """The user's scancel of the run's job (the supervisor or the abandoned relaunch closed it
    `cancelled`): the user wants the run to stop, as with `cli cancel`."""
    closes = isinstance(e, (events.AttemptEnded, events.RelaunchAbandoned))
    return closes and getattr(e, "cls", None) == FailureClass.cancelled


def over(rows: Sequence[Row]) -> Optional[str]:
    """Why the run needs no successor (finished, stopped, cancelled, paused), else None: the
    newest of these rows and the rows that (re)open it decides."""
    if current_stop(rows) is not None:
        return events.Stopped.kind
    for e in reversed(rows):
        # paused (train.pause_at_step): the user resumes it, not a successor
        if isinstance(e, (events.Finished, events.Cancelled, events.Paused)):
            return e.kind
        if _hand_cancel(e):
            return events.Cancelled.kind
        if isinstance(e, (events.Started, events.Submitted)):
            return None
    return None


def queued(rows: Sequence[Row]) -> list[str]:
    """Successor job ids the ledger names, oldest first, less those cancelled or started since."""
    gone = {i for e in rows if isinstance(e, events.SuccessorCancelled) for i in e.new_job_ids}
    gone |= {str(e.job_id) for e in rows if isinstance(e, events.Started)}
    ids = [e.new_job_id for e in rows if isinstance(e, events.SuccessorQueued) and e.new_job_id]
    return [i for i in ids if i not in gone]


def _mine(rows: Sequence[Row], job_id: str) -> bool:
    """`job_id` is a recorded successor the batch shell never made the run's next job (`adopt`)."""
    ids = {e.new_job_id for e in rows if isinstance(e, events.SuccessorQueued)}
    owned = {str(e.job_id) for e in rows if isinstance(e, events.Submitted)}
    return bool(job_id) and job_id in ids and job_id not in owned


def not_needed(
    rows: Sequence[Row],
    job_id: str,
    end_state: Callable[[str], Optional[str]] = lambda job: None,
    reread: Optional[Callable[[], Sequence[Row]]] = None,
) -> Optional[str]:
    """Why this starting job, a recorded successor (`_mine`), must not train, else None.

    Slurm releases a singleton as soon as the job before it is signalled (time limit, scancel:
    TIMEOUT or CANCELLED while still COMPLETING), when that job's trap or supervisor may still be
    choosing its next job. So that job is waited out first (`end_state`: its state once no
    longer COMPLETING; None: unknown) and the ledger read again (`reread`). Then: the run is
    over; this successor was cancelled; the dying job named another next job (resubmitted) or
    lives on (requeued); or it was scancel'ed (CANCELLED, not preempted: KillWait may have
    killed its batch shell before any `cancelled` row)."""
    if not _mine(rows, job_id):
        return None
    last = ledger.owner([e for e in rows if str(e.job_id) != job_id])
    state = end_state(str(last.job_id)) if last is not None else None
    rows = reread() if reread is not None else rows
    if not _mine(rows, job_id):
        return None
    if any(isinstance(e, events.SuccessorCancelled) and job_id in e.new_job_ids for e in rows):
        return events.SuccessorCancelled.kind
    why = over(rows)
    now = ledger.owner([e for e in rows if str(e.job_id) != job_id])
    if why is not None or now is None or last is None:
        return why
    if str(now.job_id) != str(last.job_id):  # the next job the dying one chose, unless ended
        later = end_state(str(now.job_id))
        return events.Resubmitting.kind if later is None or later in ACTIVE else None
    if state in ACTIVE:  # the job the dying one queued, read before it was waited out
        resubmitted = isinstance(last, events.Submitted) and last.requeue_of
        return events.Resubmitting.kind if resubmitted else events.Requeued.kind
    return events.Cancelled.kind if state == CANCELLED else None


def end_state(job_id: str, wait_s: float = 120.0) -> Optional[str]:
    """Slurm's state of the job once it is no longer COMPLETING (scontrol every 2 s, up to
    `wait_s`: KillWait and the epilog); a preempted job's CANCELLED is PREEMPTED; None when Slurm
    cannot say (no longer holds the record: MinJobAge). Asked of the job a successor follows."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            info = slurm_cmd.job_info(job_id)
        except (slurm_text.SlurmError, IndexError):
            return None
        state = info.get("JobState")
        if state != "COMPLETING" or time.monotonic() >= deadline:
            break
        time.sleep(2.0)
    if state == CANCELLED and info.get("PreemptTime", "None") not in ("None", ""):
        return "PREEMPTED"
    return state


def shown(rows: Sequence[Row]) -> Optional[str]:
    """`status`'s line: `successor 1234 pending` (from the ledger alone: no Slurm call)."""
    ids = queued(rows)
    return f"successor {ids[-1]} pending" if ids and over(rows) is None else None


def pending(name: str, mine: str) -> list[str]:
    """This user's pending jobs named `name`, other than `mine` (one squeue)."""
    out = slurm_cmd.run(["squeue", "-h", "-u", getpass.getuser(), "-n", name, "-o", "%i|%T"])
    jobs = (line.strip().split("|") for line in out.splitlines() if "|" in line)
    return [job for job, state in jobs if state == PENDING and job != mine]


def queue(run: RunDir, where: events.Where) -> str:
    """`sbatch --dependency=singleton job.sbatch`, recorded as `successor_queued`."""
    new_id = slurm_cmd.sbatch(["--dependency=singleton"], str(run.sbatch))
    run.record(events.SuccessorQueued(new_job_id=new_id), **where)
    return new_id


def cancel(
    run: RunDir, ids: list[str], reason: str, where: events.Where, scancel: bool = True
) -> None:
    """scancel the pending successors `ids`, recorded first (a crash between leaves them named)."""
    run.record(events.SuccessorCancelled(new_job_ids=tuple(ids), reason=reason), **where)
    if not scancel:
        return
    try:
        slurm_cmd.run(["scancel", *ids])
    except slurm_text.SlurmError as err:  # one ended meanwhile: scancel says so
        print(f"slurmtrain: cancelling successor(s) {' '.join(ids)}: {err}", file=sys.stderr)


def settle(
    run: RunDir, cfg: RootConfig, job_id: str, job_name_now: str, start: bool = False
) -> tuple[Optional[str], int]:
    """At a job's start or end: cancel the successors of a run that is over, else queue one when
    none is pending. Returns what it did (for the batch log) and the batch script's code: at the
    `start` of a successor the run no longer needs, EXIT_NOT_NEEDED. Only in a job running under
    the run's own name (an array task's name is the array's: no successor)."""
    own = job_name(cfg.name, run.path)
    if not cfg.faults.successor or job_name_now != own:
        return None, 0
    where = events.Where(job_id=job_id)
    # first: it may wait out the job before (COMPLETING), whose decisions change the ledger
    late = not_needed(run.run_events(), job_id, end_state, run.run_events) if start else None
    if late is not None:  # retired in the ledger too: never counted as pending again
        cancel(run, [job_id], late, where, scancel=False)
    rows = run.run_events()
    named = queued(rows)
    waiting = [i for i in pending(own, job_id) if i in named]
    why, code = (late, EXIT_NOT_NEEDED) if late is not None else (over(rows), 0)
    if why is not None:
        done = [f"run {why}:"] + (["this successor trains nothing;"] if code else [])
        if waiting:
            cancel(run, waiting, why, where)
            done.append(f"successor(s) {' '.join(waiting)} cancelled")
        return (" ".join(done).rstrip(";:") if len(done) > 1 else None), code
    if waiting:
        return None, 0
    return f"successor {queue(run, where)} queued", 0


def adopt(run: RunDir, job_id: str, excluded: Sequence[str], where: events.Where) -> Optional[str]:
    """The pending successor made the run's next job (recorded `submitted`, requeue_of `job_id`,
    kept off `excluded`): its id, or None (no successor, or this job does not run under the run's
    own name, so the singleton would not wait for it) after cancelling any still pending. The
    caller recorded `resubmitting` first."""
    cfg = load_run_config(str(run.config))
    own = job_name(cfg.name, run.path)
    if not cfg.faults.successor or os.environ.get("SLURM_JOB_NAME") != own:
        return None
    named = queued(run.run_events())
    waiting = [i for i in pending(own, job_id) if i in named]
    if not waiting:
        return None
    chosen, rest = waiting[0], waiting[1:]
    try:
        if excluded:
            slurm_cmd.exclude_nodes(chosen, list(excluded))
    except slurm_text.SlurmError as err:
        print(f"slurmtrain: successor {chosen} not reused ({err}): cancelled", file=sys.stderr)
        chosen, rest = "", waiting
    if rest:  # never two next jobs: a spare successor would race the one chosen
        cancel(run, rest, events.Resubmitting.kind, where)
    if not chosen:
        return None
    owner = events.Submitted(
        executor="slurm", fingerprint=run.path.name, requeue_of=job_id, after=job_id
    )
    run.record(owner, job_id=chosen)
    return chosen


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m slurmtrain.batch.successor RUN_DIR [--start]` (the batch shell). Never fails
    the job: a successor is a safety net; the supervisor's restart path stays the normal one."""
    args = sys.argv[1:] if argv is None else argv
    try:
        run = RunDir(Path(args[0]).resolve())
        cfg = load_run_config(str(run.config))
        env = os.environ
        name_now = env.get("SLURM_JOB_NAME", "")
        job = env.get("SLURM_JOB_ID", "")
        done, code = settle(run, cfg, job, name_now, start="--start" in args[1:])
    except Exception as err:  # noqa: BLE001  the net must not take the job down
        print(f"slurmtrain: successor: {type(err).__name__}: {err}", file=sys.stderr)
        return 0
    if done:
        print(f"slurmtrain: {done}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
