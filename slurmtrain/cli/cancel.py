"""`slurmtrain cancel RUN`: stop every queued or running job of a run, for good.

The run's jobs are found in one `squeue`: those carrying its tag (`--comment`, in job.sbatch too:
login/slurm_submit.run_tag) and those the ledger names. `cancelled` is recorded before `scancel`,
so the supervisor never restarts an attempt the cancel postdates; a job it submitted meanwhile
carries the tag, so squeue is asked again until the run's jobs have left the queue (and every
start checks for the cancel: compute/faults/owner.py). Checkpoints are kept: submitting the same
config again resumes. No torch: a login node, a fraction of a second.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
import time
from typing import Optional, Sequence

from slurmtrain.cli import run_arg
from slurmtrain.common import ledger, slurm_cmd
from slurmtrain.common.events import (
    Cancelled,
    Finished,
    Requeued,
    Row,
    Submitted,
    SuccessorQueued,
)
from slurmtrain.common.liveness import ACTIVE_SLURM_STATES
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.slurm_text import SlurmError
from slurmtrain.login.slurm_submit import run_tag


def find_run(arg: str, runs_root: Optional[str]) -> RunDir:
    """The run `arg` names (cli/run_arg.py); of several, the one whose job is queued or running;
    SystemExit(2) with one line otherwise: cancel never guesses."""
    paths, root = run_arg.resolve(arg, runs_root)
    found = [RunDir(p) for p in paths]
    if len(found) == 1:
        return found[0]
    if found:
        listing = _listing_or_fail()
        alive = [r for r in found if _active(r, listing)]
        if len(alive) == 1:
            return alive[0]
        _fail(
            f"run name {arg!r}: {len(found)} run directories under {root} "
            f"({', '.join(r.path.name for r in found)}); pass the directory to cancel"
        )
    _fail(run_arg.not_found(arg, root))
    raise AssertionError


def _listing_or_fail() -> str:
    try:
        return _listing()
    except SlurmError as err:
        _fail(f"cannot list this user's jobs ({err}); nothing cancelled; try again")
        raise AssertionError from err


def _fail(line: str) -> None:
    print(f"slurmtrain cancel: {line}", file=sys.stderr)
    raise SystemExit(2)


def job_ids(events: Sequence[Row]) -> list[str]:
    """Every Slurm job id the run ever had, oldest first (submissions, requeues, resubmissions,
    successors)."""
    ids: list[Optional[str]] = []
    for e in events:
        if isinstance(e, Submitted) and e.executor in (None, "slurm"):
            ids.append(e.job_id)
        elif isinstance(e, Requeued):
            ids += [e.job_id, e.new_job_id]
        elif isinstance(e, SuccessorQueued):  # pending singleton (batch/successor.py): named in
            ids.append(e.new_job_id)  # `cancelled`, so it never trains if it starts later
    return list(dict.fromkeys(i for i in ids if i and i != "None"))


def _listing() -> str:
    """This user's jobs, one line per job and array task: `id|comment|state` (one squeue)."""
    user = getpass.getuser()
    return slurm_cmd.run(["squeue", "-h", "-r", "-u", user, "-o", "%i|%k|%T"])


def active_of(listing: str, tag: str, ledger_ids: list[str]) -> list[str]:
    """The queued or running jobs of a run in a `_listing`: tagged, or named by its ledger."""
    named = set(ledger_ids)
    found = []
    for line in listing.splitlines():
        job, comment, state = (line.strip().split("|") + ["", ""])[:3]
        if state in ACTIVE_SLURM_STATES and (tag in comment.split() or job in named):
            found.append(job)
    return list(dict.fromkeys(found))


def _active(run: RunDir, listing: str) -> list[str]:
    return active_of(listing, run_tag(run.path), job_ids(run.run_events()))


def cancel(run: RunDir, wait_s: float, poll_s: float = 1.0) -> tuple[list[str], list[str]]:
    """(job ids scancel'ed, ids still in the queue when `wait_s` ran out)."""
    listing = _listing()
    known = job_ids(run.run_events())
    ids = tuple(dict.fromkeys(known + _active(run, listing)))
    run.record(Cancelled(job_ids=ids, by=getpass.getuser(), host=socket.gethostname()))
    cancelled: list[str] = []
    deadline = time.time() + wait_s
    while True:
        active = _active(run, listing)
        new = [j for j in active if j not in cancelled]
        if new:
            try:
                slurm_cmd.run(["scancel", *new])
            except SlurmError as err:  # a job that ended meanwhile: scancel says so; go on
                print(f"slurmtrain cancel: {err}", file=sys.stderr)
            cancelled += new
        if not active or time.time() >= deadline:
            break
        time.sleep(poll_s)
        listing = _listing()
    if not active:
        ledger.close_cancelled(run, cancelled, "cancel")
    return cancelled, active


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="slurmtrain cancel",
        description=__doc__.splitlines()[0],
        epilog="example: slurmtrain cancel demo   (a name: its queued or running run)\n"
        "         slurmtrain cancel runs/demo/3f2a9c1e77b0 --wait 0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", metavar="RUN", help=run_arg.HELP)
    parser.add_argument(
        "--runs-root",
        help="where run names are looked up (default: $SLURMTRAIN_RUNS_ROOT or ./runs)",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=60.0,
        help="seconds to wait for the jobs to leave the queue (0: do not wait)",
    )
    args = parser.parse_args(argv)
    run = find_run(args.run, args.runs_root)
    events = run.run_events()
    if any(isinstance(e, Finished) for e in events):
        print(f"slurmtrain cancel: {run.path} already finished; nothing to cancel")
        return 0
    local = [e for e in events if isinstance(e, Submitted) and e.executor == "local"]
    if local and not job_ids(events):
        _fail(
            f"{run.path}: a local run (pid {local[-1].pid} on {local[-1].host}); "
            f"stop it with Ctrl-C or `kill -TERM` (it saves first)"
        )
    try:
        cancelled, left = cancel(run, args.wait)
    except SlurmError as err:  # squeue kept failing (retried): the jobs left may still run
        _fail(f"{run.path}: cannot list this user's jobs ({err}); run cancel again")
        raise AssertionError from err
    done = f"cancelled job(s) {', '.join(cancelled)}" if cancelled else "no queued or running job"
    print(f"slurmtrain cancel: {done} of {run.path}")
    if left:
        print(
            f"slurmtrain cancel: still in the queue after {args.wait:.0f} s: {', '.join(left)} "
            f"(completing); `squeue -j {','.join(left)}`",
            file=sys.stderr,
        )
    latest = run.latest
    if latest.is_file():
        print(
            f"slurmtrain cancel: checkpoints kept (latest {latest.read_text().strip()}); "
            f"submitting the same config again resumes it"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
