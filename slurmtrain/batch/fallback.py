"""The supervisor's last resort: whatever fails inside it, the run is not left without a job.

On an exception in the supervisor (a damaged row, an OSError on the shared filesystem, a bug),
`recover` records it (`supervisor_failed`), closes this job's open attempt as a crash and
resubmits job.sbatch plainly (held, recorded, released: next_job.submit_held), unless the ledger
shows the run ended, stopped or cancelled, or the restart already made. The next start checks
the budgets. When even the resubmit fails, `stopped` says why, so status shows it.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Optional, Sequence

from slurmtrain.batch import next_job
from slurmtrain.common import errors, events, ledger, slurm_text, windows
from slurmtrain.common.events import FailureClass, Row, Where
from slurmtrain.common.rundir import RunDir


def recover(run_dir: str, rc: int, env: dict[str, str], err: BaseException) -> int:
    """The batch script's exit code after the supervisor raised `err` on step exit code `rc`."""
    run = RunDir(Path(run_dir).resolve())
    job_id = env.get("SLURM_JOB_ID", "")
    restart, relaunch = slurm_text.attempt_counters(env)
    error = f"{type(err).__name__}: {err}"
    print(f"slurmtrain: the supervisor failed: {error}; falling back", file=sys.stderr)
    where = Where(job_id=job_id, restart=restart, relaunch=relaunch)
    try:  # the ledger itself may be what failed: then only the batch log says so
        trace = traceback.format_exc()[-4000:]
        failure = events.SupervisorFailed(error=error, traceback=trace, exit_code=rc)
        run.record(failure, **where)
    except Exception as why:  # noqa: BLE001
        print(f"slurmtrain: cannot record supervisor_failed: {why}", file=sys.stderr)
    try:
        run_rows: Sequence[Row] = run.run_events()
        verdict = _decide(run, run_rows, job_id, restart, relaunch, rc)
    except Exception as why:  # noqa: BLE001  an unreadable ledger: resubmit, the start decides
        print(f"slurmtrain: ledger unreadable ({why}): resubmitting", file=sys.stderr)
        run_rows, verdict = [], None
    if verdict is not None:
        return verdict
    attempt = ledger.attempt_of(run_rows, job_id, restart, relaunch) if run_rows else None
    where["attempt"] = attempt
    # the stop class when neither the supervisor nor this fallback could go on
    stop_cls = FailureClass.supervisor_error
    try:
        if attempt is not None and not any(
            isinstance(e, events.AttemptEnded) and e.attempt == attempt for e in run_rows
        ):
            crash = FailureClass.crash
            ended = events.AttemptEnded(cls=crash, exit_code=rc, supervisor_error=error)
            run.record(ended, **where)
        new_id = next_job.submit_held(run, job_id, [], where, reason=stop_cls)
        run.record(events.Requeued(reason=stop_cls, new_job_id=new_id, how="resubmit"), **where)
        print(f"slurmtrain: fallback restart of job {job_id} -> {new_id}", file=sys.stderr)
        return 0
    except Exception as why:  # noqa: BLE001  nothing else can restart it: say so in `stopped`
        text = f"supervisor failed ({error}); fallback resubmit failed: {why}"
        print(f"slurmtrain: stopping the run: {text}", file=sys.stderr)
        try:
            run.record(events.Stopped(cls=stop_cls, error=text), **where)
        except Exception:  # noqa: BLE001
            pass
        return next_job.EXIT_STOPPED


def _decide(
    run: RunDir, run_rows: Sequence[Row], job_id: str, restart: int, relaunch: int, rc: int
) -> Optional[int]:
    """The exit code when no resubmit is needed, else None: the step exited cleanly, another job
    holds the run, the run finished, stopped or was cancelled, or this attempt's restart exists
    already (then only made sure to be released)."""
    if rc in (0, errors.EXIT_DUPLICATE):
        return 0
    if any(isinstance(e, events.Finished) for e in run_rows):
        return 0
    if windows.current_stop(run_rows) is not None:
        return next_job.EXIT_STOPPED
    attempt = ledger.attempt_of(run_rows, job_id, restart, relaunch)
    if ledger.cancelled_since(run_rows, job_id, attempt):
        return 0

    def mine(e: Row) -> bool:  # a row of this start: (job id, restart, relaunch)
        return ledger.attempt_key(e) == (job_id, restart, relaunch)

    made = [e for e in run_rows if isinstance(e, events.Requeued) and mine(e)]
    intents = [i for i, e in enumerate(run_rows) if isinstance(e, events.Resubmitting) and mine(e)]
    later = run_rows[intents[-1] :] if intents else []
    subs = [e for e in later if isinstance(e, events.Submitted) and e.requeue_of == job_id]
    if subs:  # the supervisor got as far as submitting: make sure its job is released
        from slurmtrain.common.liveness import held

        new_id = str(subs[-1].job_id)
        if held(new_id) is not False:
            next_job.release(run, new_id, Where(job_id=job_id, attempt=attempt))
        return 0
    return 0 if made else None
