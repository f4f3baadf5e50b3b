"""Starting a run's next attempt through Slurm: requeue or resubmit, and the time-limit restart.

Why apart from the supervisor: these are the only places a run's job changes (a new job id, or
the same one requeued), so the intent-then-confirmation protocol lives in one file: `resubmitting`
is recorded first, the new job is submitted held, recorded as `submitted`, then released.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Optional, Sequence

from slurmtrain.batch import exclusions, successor
from slurmtrain.common import events, inject_spec, ledger, slurm_cmd, slurm_text
from slurmtrain.common.events import FailureClass, Where
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig, load_run_config

EXIT_STOPPED = 1  # the batch script's code when a run stops past a budget: the job is FAILED
RELEASE_TRIES = 5  # `scontrol release` + check, 1+2+4+8 s apart: ~15 s beyond Slurm's own retries


def preempted(job_id: str) -> bool:
    try:
        return slurm_cmd.is_preempted(job_id)
    except slurm_text.SlurmError:
        return False


def past_time_limit(job_id: str, margin_s: float = 5.0) -> bool:
    """The job has reached its time limit (Slurm's SIGTERM was the time limit's, not a scancel's:
    a cancelled job's EndTime is the cancel time, so StartTime + TimeLimit is compared)."""
    try:
        info = slurm_cmd.job_info(job_id)
    except slurm_text.SlurmError:
        return False
    if info.get("JobState") == "TIMEOUT":
        return True
    if info.get("JobState") not in ("RUNNING", "COMPLETING"):
        return False
    try:
        start = datetime.strptime(info.get("StartTime", ""), "%Y-%m-%dT%H:%M:%S").timestamp()
        limit = slurm_text.parse_time(info.get("TimeLimit", ""))
    except (ValueError, slurm_text.SlurmError):
        return False
    return limit is not None and time.time() >= start + limit - margin_s


def stop_no_nodes(run: RunDir, where: Where, excl: exclusions.Exclusions, why: str) -> int:
    """The run cannot go on: say why, with every exclusion, in `stopped` (status shows it)."""
    error = f"{why}; excluded: {excl.describe() or 'none'}"
    if excl.dropped:
        error += f"; not excluded (the job needs them): {', '.join(excl.dropped)}"
    run.record(events.Stopped(cls=FailureClass.no_nodes, error=error), **where)
    print(f"slurmtrain: stopping the run: {error}", file=sys.stderr)
    return EXIT_STOPPED


def restart_job(
    run: RunDir,
    job_id: str,
    bad: list[str],
    cfg: RootConfig,
    cls: str,
    where: Where,
    after: Optional[str] = None,
) -> str:
    """Start the next attempt; returns its job id.

    After a node failure Slurm may requeue this very job itself once the node is declared down;
    `scontrol requeue` of the same id makes a second copy impossible, so it is used there.
    A new job is submitted held, recorded (`submitted`), then released: it cannot start before
    the ledger names it the run's owner. `resubmitting` is recorded first, so a supervisor killed
    mid-way leaves its intent (and at worst a held job nobody can start by accident)."""
    node_failure = cls == FailureClass.node_failure
    if not after and (cfg.faults.restart == "requeue" or node_failure and not bad):
        slurm_cmd.requeue(job_id)
        if bad:
            slurm_cmd.exclude_nodes(job_id, bad)
        return job_id
    args = []
    if bad:
        args.append(f"--exclude={slurm_text.compress_hostlist(bad)}")
    if after:  # starts only once this job has ended: never beside it
        args.append(f"--dependency=afterany:{after}")
    return submit_held(run, job_id, args, where, reason=cls, excluded=bad, after=after)


def submit_held(
    run: RunDir,
    job_id: str,
    args: list[str],
    where: Where,
    after: Optional[str] = None,
    *,
    reason: str,
    excluded: Optional[Sequence[str]] = None,
) -> str:
    """`sbatch --hold job.sbatch`, recorded as the run's owner (`submitted`, `requeue_of` this
    job, `after`: the job it starts after), then released and checked (`release`);
    `resubmitting` (why: `reason`, nodes `excluded`) first. A pending successor is adopted
    instead (batch/successor.adopt: recorded the same way; singleton, it starts after this job)."""
    intent = events.Resubmitting(
        reason=reason, excluded=None if excluded is None else tuple(excluded)
    )
    run.record(intent, **where)
    if not injected("skip_release", where):  # (the drill needs a held job)
        # faults.successor: the pending successor is the next job, never raced by a second one
        try:
            adopted = successor.adopt(run, job_id, excluded or (), where)
        except slurm_text.SlurmError as err:  # squeue failed: a new job; the run lock guards
            print(f"slurmtrain: successor not reused: {err}", file=sys.stderr)
            adopted = None
        if adopted:
            return adopted
    # retried on transient errors without ever queueing a second copy (slurm_cmd.sbatch)
    new_id = slurm_cmd.sbatch(["--hold", *args], str(run.sbatch))
    owner = events.Submitted(
        executor="slurm", fingerprint=run.path.name, requeue_of=job_id, after=after or None
    )
    run.record(owner, job_id=new_id)
    if injected("skip_release", where):  # a drill: the supervisor dies before the release
        return new_id
    release(run, new_id, where)
    return new_id


def release(run: RunDir, job_id: str, where: Where, tries: int = RELEASE_TRIES) -> bool:
    """`scontrol release` the held job, then ask squeue that it is no longer held; again with
    backoff (1, 2, 4, ... s) up to `tries` times. False, with `release_failed` recorded, when it
    stays held (or squeue cannot say): the liveness check releases or drops a held owner older
    than $SLURMTRAIN_HELD_OWNER_S (common/liveness.py), so the run is not wedged for good."""
    from slurmtrain.common.liveness import held

    error, delay = "", 1.0
    for i in range(tries):
        try:
            slurm_cmd.run(["scontrol", "release", job_id])  # retried on transient errors
        except slurm_text.SlurmError as err:
            error = str(err)
            print(f"slurmtrain: scontrol release {job_id}: {err}", file=sys.stderr)
        if held(job_id) is False:
            return True
        if i + 1 < tries:
            time.sleep(delay)
            delay *= 2
    error = error or f"job {job_id} still held after {tries} releases"
    run.record(events.ReleaseFailed(new_job_id=job_id, error=error), **where)
    return False


def injected(key: str, where: Where) -> bool:
    """A drill's fault in the supervisor itself, from SLURMTRAIN_INJECT (the compute nodes'
    syntax, compute/faults/inject.py, read here without importing compute: `key=1`, and
    `attempts=1` confines it to those attempts)."""
    cfg = inject_spec.parse(os.environ)
    only = cfg.get("attempts")
    if only and str(where.get("attempt")) not in only.split("+"):
        return False
    return bool(cfg.get(key))


def on_sigterm(run_dir: str, env: dict[str, str]) -> int:
    """The batch shell's SIGTERM trap: at the time limit the ranks may still be saving when
    KillWait's SIGKILL ends the whole job, batch shell included, so the restart is made now: the
    attempt is closed `timed_out` and the next job is submitted to start after this one ends.
    Any other SIGTERM (scancel, preemption) is left to the supervisor after srun."""
    run = RunDir(Path(run_dir).resolve())
    cfg = load_run_config(str(run.config))
    job_id = env.get("SLURM_JOB_ID", "")
    if not past_time_limit(job_id):
        return 0
    restart, relaunch = slurm_text.attempt_counters(env)
    run_rows = run.run_events()  # only whether the attempt is closed: no rank's row is needed
    attempt = ledger.attempt_of(run_rows, job_id, restart, relaunch)
    rows = ledger.attempt_rows(run_rows, job_id, restart, attempt, relaunch)
    closed = (events.AttemptEnded, events.Finished, events.Stopped)
    if attempt is None or any(isinstance(e, closed) for e in rows):
        return 0
    nodes = (
        slurm_text.expand_hostlist(env["SLURM_JOB_NODELIST"])
        if env.get("SLURM_JOB_NODELIST")
        else []
    )
    where = Where(job_id=job_id, attempt=attempt, nodes=nodes, restart=restart)
    timed_out = FailureClass.timed_out
    run.record(events.AttemptEnded(cls=timed_out, at="time limit"), **where)
    if ledger.over_budget(run.run_events(), cfg.faults) is not None:
        run.record(events.Stopped(cls=timed_out, error="time-limit budget"), **where)
        return EXIT_STOPPED
    excl = exclusions.plan(run, cfg)
    try:
        new_id = restart_job(run, job_id, excl.nodes, cfg, timed_out, where, after=job_id)
    except slurm_text.SlurmError as err:
        return stop_no_nodes(run, where, excl, f"Slurm refused the restart: {err}")
    resubmitted = events.Requeued(
        reason=timed_out,
        new_job_id=new_id,
        how="resubmit",
        excluded=tuple(excl.nodes),
        at="time limit",
    )
    run.record(resubmitted, **where)
    print(
        f"slurmtrain: time limit: job {job_id} -> {new_id} (after this job ends)", file=sys.stderr
    )
    return 0
