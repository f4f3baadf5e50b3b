"""The run's successor: a pending `--dependency=singleton` copy of job.sbatch kept in the queue
while a Slurm run is alive (faults.successor), so losing the batch node or the whole allocation
costs one queue wait, not a human.

Why singleton: it releases when every other job of the same name has ended, and a run's jobs carry
a name of their own (`job_name`: st-NAME-FINGERPRINT8), so sweep points and other runs never wait
on each other. The successor is the very job.sbatch (the file submitted is the file resubmitted),
recorded as `successor_queued`, not `submitted`: it is not the run's owner until it starts, so it
never blocks the run lock; when it starts while another job holds the run, that lock refuses it.

`settle` runs in the batch shell at a job's start and end (one squeue, at most one sbatch or
scancel): a run that finished, stopped, paused or was cancelled has its pending successors
cancelled;
otherwise one is queued when none is pending (the successor that starts queues its own).

Arrays (sweeps) get none: their tasks share the array's name, so a singleton would wait on every
point; one successor per point would need its own script (job.sbatch is per point, the array's
is not). A point restarted by its supervisor runs its own job.sbatch under its own name, and from
then on has a successor like any single run.
"""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from slurmtrain.common import events, slurm_cmd, slurm_text
from slurmtrain.common.events import Row
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig, load_run_config
from slurmtrain.common.windows import current_stop

PENDING = "PENDING"


def job_name(name: str, run_dir: str | Path) -> str:
    """A run's own Slurm job name: its config name and its fingerprint's first 8 characters."""
    return f"st-{name}-{Path(run_dir).name[:8]}"


def over(rows: Sequence[Row]) -> Optional[str]:
    """Why the run needs no successor (finished, stopped, cancelled, paused), else None: the
    newest of these rows and the rows that (re)open it decides."""
    if current_stop(rows) is not None:
        return events.Stopped.kind
    for e in reversed(rows):
        # paused (train.pause_at_step): the user resumes it, not a successor
        if isinstance(e, (events.Finished, events.Cancelled, events.Paused)):
            return e.kind
        if isinstance(e, (events.Started, events.Submitted)):
            return None
    return None


def queued(rows: Sequence[Row]) -> list[str]:
    """Successor job ids the ledger names, oldest first, less those cancelled or started since."""
    gone = {i for e in rows if isinstance(e, events.SuccessorCancelled) for i in e.new_job_ids}
    gone |= {str(e.job_id) for e in rows if isinstance(e, events.Started)}
    ids = [e.new_job_id for e in rows if isinstance(e, events.SuccessorQueued) and e.new_job_id]
    return [i for i in ids if i not in gone]


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


def cancel(run: RunDir, ids: list[str], reason: str, where: events.Where) -> None:
    """scancel the pending successors `ids`, recorded first (a crash between leaves them named)."""
    run.record(events.SuccessorCancelled(new_job_ids=tuple(ids), reason=reason), **where)
    try:
        slurm_cmd.run(["scancel", *ids])
    except slurm_text.SlurmError as err:  # one ended meanwhile: scancel says so
        print(f"slurmtrain: cancelling successor(s) {' '.join(ids)}: {err}", file=sys.stderr)


def settle(run: RunDir, cfg: RootConfig, job_id: str, job_name_now: str) -> Optional[str]:
    """At a job's start or end: cancel the successors of a run that is over, else queue one when
    none is pending. Returns what it did, for the batch log. Only in a job running under the run's
    own name (an array task's name is the array's: no successor)."""
    own = job_name(cfg.name, run.path)
    if not cfg.faults.successor or job_name_now != own:
        return None
    rows = run.run_events()
    where = events.Where(job_id=job_id)
    named = queued(rows)
    waiting = [i for i in pending(own, job_id) if i in named]
    why = over(rows)
    if why is not None:
        if waiting:
            cancel(run, waiting, why, where)
            return f"run {why}: successor(s) {' '.join(waiting)} cancelled"
        return None
    if waiting:
        return None
    return f"successor {queue(run, where)} queued"


def retire(run: RunDir, cfg: RootConfig, job_id: str, why: str, where: events.Where) -> None:
    """The supervisor queued the next job itself (resubmit, time limit): the pending successor
    would race it for the run and be refused, so it goes; the next job queues its own at start."""
    if not cfg.faults.successor:
        return
    named = queued(run.run_events())
    waiting = [i for i in pending(job_name(cfg.name, run.path), job_id) if i in named]
    if waiting:
        cancel(run, waiting, why, where)


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m slurmtrain.batch.successor RUN_DIR` (the batch shell). Never fails the job: a
    successor is a safety net; the supervisor's restart path stays the normal one."""
    args = sys.argv[1:] if argv is None else argv
    try:
        run = RunDir(Path(args[0]).resolve())
        cfg = load_run_config(str(run.config))
        env = os.environ
        done = settle(run, cfg, env.get("SLURM_JOB_ID", ""), env.get("SLURM_JOB_NAME", ""))
    except Exception as err:  # noqa: BLE001  the net must not take the job down
        print(f"slurmtrain: successor: {type(err).__name__}: {err}", file=sys.stderr)
        return 0
    if done:
        print(f"slurmtrain: {done}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
