"""The batch shell's supervisor: `python -m slurmtrain.batch.supervise RUN_DIR --rc CODE` after srun.

It runs in the batch shell, outside any container (scontrol is there), once per attempt after
every rank has exited, so it sees the attempt's real outcome: it classifies the exit (verdict.py),
records `attempt_ended`, and within the failure budgets starts the next attempt; past a budget it
records `stopped`. No torch import.

Next attempt, `faults.restart`:
- `resubmit` (default): `sbatch job.sbatch` (new job id, bad nodes excluded), then this job ends.
  A requeued job restarted at once on a node that ran it within `cred_expire` is refused by slurmd
  ("Job credential revoked"), and otherwise waits that long; a new job id has neither problem.
- `requeue`: `scontrol requeue` (same job id, Slurm's own restart count), paying the site's delay.

An attempt is (job id, SLURM_RESTART_COUNT): a start that died before `started` gets its own
`attempt_ended` (class crash, `before_started`), never the previous start's outcome. Slurm's
SIGTERM reaches the batch shell too: the script traps it and this process ignores it, so the
restart still happens. A new job is submitted held, recorded, then released, so it never starts
before the ledger names it (compute/faults/owner.py checks that). Whatever this process raises,
`main` records it (`supervisor_failed`) and falls back to a plain resubmit (batch/fallback.py).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from slurmtrain.batch import culprit, exclusions, fallback, in_allocation, next_job
from slurmtrain.batch.verdict import (  # noqa: F401  re-exported: tools and tests import them here
    AttemptView,
    Verdict,
    _effective_rc,
    attempt_view,
    classify,
    judge,
    never_joined,
    node_check_s,
    verdict_of,
)
from slurmtrain.common import errors, events, ledger, slurm_cmd, slurm_text, windows
from slurmtrain.common.derived import restarts_in_allocation
from slurmtrain.common.events import FailureClass
from slurmtrain.common.jsonl import append_jsonl, merge_rows
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig, load_run_config

EXIT_STOPPED = next_job.EXIT_STOPPED


def supervise(
    run_dir: str,
    rc: int,
    env: dict[str, str],
    terminated: bool = False,
    relaunch_file: Optional[str] = None,
) -> int:
    """Decide what the step's exit means and start the next attempt. Returns the batch script's
    exit code; EXIT_RELAUNCH (with the nodes in `relaunch_file`) runs the next attempt in this
    allocation."""
    run = RunDir(Path(run_dir).resolve())
    cfg = load_run_config(str(run.config))
    job_id = env.get("SLURM_JOB_ID", "")
    restart, relaunch = slurm_text.attempt_counters(env)
    nodes = (
        slurm_text.expand_hostlist(env["SLURM_JOB_NODELIST"])
        if env.get("SLURM_JOB_NODELIST")
        else []
    )
    if rc == errors.EXIT_DUPLICATE:  # another live job owns the run: leave it alone
        print(f"slurmtrain: job {job_id} did not train {run.path}: another job holds it")
        return 0
    view = attempt_view(run, job_id, restart, relaunch)
    ledger_rows, attempt, rows = view.events, view.attempt, view.rows
    closing = [e for e in rows if isinstance(e, (events.Finished, events.Stopped))]
    if attempt is not None and closing:
        # Stopped by a budget: exit non-zero, or `--dependency=afterok` on this job (the big job
        # of a smoke chain) would start after a run that failed.
        return EXIT_STOPPED if any(isinstance(e, events.Stopped) for e in closing) else 0
    where = events.Where(
        job_id=job_id, attempt=attempt, nodes=nodes, restart=restart, relaunch=relaunch
    )
    if attempt is not None and any(isinstance(e, events.AttemptEnded) for e in rows):
        return 0  # closed already: by on_sigterm's early restart, or by `cli cancel`
    if ledger.cancelled_since(ledger_rows, job_id, attempt):  # `cli cancel`: never restart it
        run.record(events.AttemptEnded(cls=FailureClass.cancelled, exit_code=rc), **where)
        return 0
    rc = _effective_rc(rc, rows)
    if rc == 0:
        return 0
    if terminated and rc != errors.EXIT_TERMINATED and next_job.past_time_limit(job_id):
        rc = errors.EXIT_REQUEUE  # the time limit struck mid-save: still a time-limit restart
    if rc == errors.EXIT_TERMINATED:
        # Slurm 22.05 requeues a preempted job only if it outlives GraceTime; ours saved and exited
        # first, so it requeues itself (same job id: no second copy can appear). A scancel is final.
        if not next_job.preempted(job_id):
            run.record(events.AttemptEnded(cls=FailureClass.cancelled, exit_code=rc), **where)
            return 0
        return _preempted(run, cfg, job_id, rc, where)
    # In-allocation: a dead node is found by probing its slurmd now, not by waiting for Slurm.
    inside = relaunch_file is not None and restarts_in_allocation(cfg) and not terminated
    return _failed(run, cfg, view, rc, where, env, relaunch_file if inside else None)


def _failed(
    run: RunDir,
    cfg: RootConfig,
    view: AttemptView,
    rc: int,
    where: events.Where,
    env: dict[str, str],
    relaunch_file: Optional[str],
) -> int:
    """A failed step (`rc`): judged, closed, then the run stops past a budget, or the next
    attempt starts in this allocation (`relaunch_file`: its nodes) or through Slurm."""
    job_id = env.get("SLURM_JOB_ID", "")
    ledger_rows, attempt, rows = view.events, view.attempt, view.rows
    inside = relaunch_file is not None
    hosts = in_allocation.step_hosts(ledger_rows, attempt) or where.get("nodes") or []
    verdict = judge(view, rc, hosts, 0.0 if inside else node_check_s(cfg), probe=inside)
    cls = verdict.cls
    if attempt is None:  # a start that failed before `started` may be the user's after a stop
        windows.open_window(run, run.run_events(), job_id)
    lost = _close(run, view, verdict, rc, where)
    ledger_rows = merge_rows([run.run_events(), view.rank])  # with what was just recorded
    stop = ledger.over_budget(ledger_rows, cfg.faults)
    if stop is not None or not events.restarts(cls):
        error = (
            ledger.stop_detail(ledger_rows, cfg.faults, stop or cls)
            or _last_error(ledger_rows, rows)
            or f"exit code {rc}"
        )
        run.record(events.Stopped(cls=stop or cls, error=error), **where)
        print(
            f"slurmtrain: stopping the run: {stop or cls} budget exhausted; last error: {error}",
            file=sys.stderr,
        )
        return rc
    excl = exclusions.plan(run, cfg)
    if relaunch_file is not None:
        step = in_allocation.plan(
            cfg,
            cls,
            in_allocation.allocation_nodes(job_id, env),
            hosts,
            failed=sorted(set(lost) | set(verdict.exclude)),
            excluded=excl.nodes,
            optional=in_allocation.suspects(cls, verdict.nodes, rows, ledger_rows),
        )
        if step is not None:
            return _relaunch(run, step, cls, relaunch_file, where)
    return _restart(run, cfg, job_id, cls, excl, where)


def _close(
    run: RunDir, view: AttemptView, verdict: Verdict, rc: int, where: events.Where
) -> list[str]:
    """Record how the attempt ended (`attempt_ended`), the nodes it lost (`node_lost`: returned)
    and those the next attempts exclude (bad_nodes.jsonl)."""
    cls = verdict.cls
    lost = verdict.nodes if cls == FailureClass.node_failure else []
    failed = [e for e in view.rows if isinstance(e, events.Failed)]
    ended = events.AttemptEnded(
        cls=cls,
        exit_code=rc,
        step=next((e.step for e in failed if e.step is not None), None),
        before_started=True if view.attempt is None else None,
        failed_nodes=() if cls == FailureClass.node_failure else tuple(verdict.nodes),
    )
    run.record(ended, **where)
    run.record(culprit.blame(run, view, verdict), **where)  # who failed it, and why: at once
    for node in lost:
        run.record(events.NodeLost(node=node), **where)
    for node, reason in verdict.exclude.items():
        append_jsonl(
            run.bad_nodes,
            {
                "node": node,
                "reason": reason,
                "time": time.time(),
                "attempt": view.attempt,
                "job_id": where.get("job_id"),
                # a requeued job keeps its id: this tells its attempts apart
                "restart": where.get("restart"),
                "relaunch": where.get("relaunch"),
            },
            durable=True,
        )
    return lost


def _relaunch(
    run: RunDir, step: in_allocation.Relaunch, cls: str, relaunch_file: str, where: events.Where
) -> int:
    """The next attempt runs in this allocation, on `step`'s nodes (named in `relaunch_file`)."""
    step.write(relaunch_file)
    relaunched = events.RestartedInAllocation(
        reason=cls,
        left_out=tuple(step.failed),
        swapped_in=tuple(step.swapped_in),
        step_nodes=tuple(step.nodes),
        spares_left=step.spares_left,
    )
    run.record(relaunched, **where)
    print(
        f"slurmtrain: {cls}: next attempt inside job {where.get('job_id')} on "
        f"{slurm_text.compress_hostlist(step.nodes)} (left out: "
        f"{', '.join(step.failed) or 'none'}; spares left: {step.spares_left})",
        file=sys.stderr,
    )
    return errors.EXIT_RELAUNCH


def _restart(
    run: RunDir,
    cfg: RootConfig,
    job_id: str,
    cls: str,
    excl: exclusions.Exclusions,
    where: events.Where,
) -> int:
    """The next attempt through Slurm (requeue or resubmit), or a stop when Slurm refuses."""
    if excl.problem:
        return next_job.stop_no_nodes(run, where, excl, excl.problem)
    try:
        new_id = next_job.restart_job(run, job_id, excl.nodes, cfg, cls, where)
    except slurm_text.SlurmError as err:
        print(f"slurmtrain: restart of job {job_id} failed: {err}", file=sys.stderr)
        return next_job.stop_no_nodes(run, where, excl, f"Slurm refused the restart: {err}")
    how = "requeue" if new_id == job_id else "resubmit"
    restarted = events.Requeued(
        reason=cls,
        new_job_id=new_id,
        how=how,
        excluded=tuple(excl.nodes),
        exclusions_dropped=tuple(excl.dropped),
    )
    run.record(restarted, **where)
    print(
        f"slurmtrain: restart of job {job_id} -> {new_id} ({cls}); excluded: "
        f"{excl.describe() or 'none'}",
        file=sys.stderr,
    )
    return 0


def _preempted(run: RunDir, cfg: RootConfig, job_id: str, rc: int, where: events.Where) -> int:
    """A preempted attempt: closed, then requeued (same job id) within the preemption budget."""
    run.record(events.AttemptEnded(cls=FailureClass.preempted, exit_code=rc), **where)
    if ledger.over_budget(run.run_events(), cfg.faults) is not None:
        why = "preemption budget exhausted"
        run.record(events.Stopped(cls=FailureClass.preempted, error=why), **where)
        return EXIT_STOPPED
    slurm_cmd.requeue(job_id)
    requeued = events.Requeued(reason=FailureClass.preempted, new_job_id=job_id, how="requeue")
    run.record(requeued, **where)
    return 0


def _last_error(run_rows: Sequence[events.Row], rows: Sequence[events.Row]) -> Optional[str]:
    """The attempt's last real error (an all-rank failure: the one rank with a cause of its own,
    not the last of its peers' connection errors), else its last error, else the run's."""
    errs = [e for e in rows if isinstance(e, events.Failed) and e.error]
    errs = ledger.real_errors(errs) or errs
    if errs:
        return errs[-1].error.strip().splitlines()[-1]
    return ledger.last_error(run_rows, rows[0].attempt if rows else None)


def main(argv: Optional[list[str]] = None) -> None:
    import argparse

    # Slurm's SIGTERM reaches the batch step's every process: finish the restart first (the
    # batch script traps it too); SIGKILL after KillWait still ends us.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parser = argparse.ArgumentParser(prog="python -m slurmtrain.batch.supervise")
    parser.add_argument("run_dir")
    parser.add_argument("--rc", type=int, required=True, help="exit code of the srun step")
    parser.add_argument(
        "--terminated", action="store_true", help="the batch shell received SIGTERM"
    )
    parser.add_argument(
        "--sigterm", action="store_true", help="called from the SIGTERM trap (time limit)"
    )
    parser.add_argument(
        "--relaunch-file",
        help="where to name the next in-allocation attempt's nodes (batch script with spares)",
    )
    args = parser.parse_args(argv)
    env = dict(os.environ)
    try:
        if args.sigterm:
            raise SystemExit(next_job.on_sigterm(args.run_dir, env))
        if next_job.injected("supervisor_raise", {"attempt": _attempt_number(args.run_dir, env)}):
            raise OSError("injected supervisor failure")  # a drill: the catch-all below
        code = supervise(args.run_dir, args.rc, env, args.terminated, args.relaunch_file)
    except Exception as err:  # noqa: BLE001  never a silent end: record it, resubmit plainly
        # From the time-limit trap (--rc 0) nothing is resubmitted: the supervisor after srun runs.
        code = fallback.recover(args.run_dir, args.rc, env, err)
    raise SystemExit(code)


def _attempt_number(run_dir: str, env: dict[str, str]) -> Optional[int]:
    """This job start's attempt number (None before `started`): for a drill's `attempts=`."""
    if "supervisor_raise" not in env.get("SLURMTRAIN_INJECT", ""):
        return None  # read the ledger only for the drill
    run_rows = RunDir(Path(run_dir).resolve()).run_events()
    restart, relaunch = slurm_text.attempt_counters(env)
    return ledger.attempt_of(run_rows, env.get("SLURM_JOB_ID", ""), restart, relaunch)


if __name__ == "__main__":
    main()
