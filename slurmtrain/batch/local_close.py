"""The local executor's supervisor half: a failed local job's attempt closed, and the budget stop
recorded, when the job ends (login/local_submit.py calls it; batch/supervise.py does it on Slurm).

Why here and now: the local executor never restarts an attempt, so nothing closed a crashed one
until the next start did (compute/attempt.py's vanished attempt), and only then found the run past
its budget: the user's first rerun after a fix was stopped at once. Recorded when the job ends, the
stop shows in `status` at once, and the rerun, a user's submission after a stop, opens a new budget
window (common/windows.py) and trains. No torch import.
"""

from __future__ import annotations

import socket
from typing import Optional

from slurmtrain.batch.verdict import attempt_view
from slurmtrain.common import events, ledger, windows
from slurmtrain.common.events import FailureClass
from slurmtrain.common.jsonl import merge_rows
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig

LOCAL_RC = 1  # submitit reports a failed local job, not its exit code


def close_failed(run: RunDir, cfg: RootConfig, job_id: str) -> Optional[events.Stopped]:
    """After local job `job_id` failed: its `attempt_ended` (classified from its rows as the Slurm
    supervisor classifies them), then `stopped` when the run is past a budget or the class never
    restarts; the `stopped` row, else None. Nothing when the attempt closed itself (diverged,
    checkpoint_unreadable, a stop at its start)."""
    view = attempt_view(run, job_id, 0, 0)
    closing = (events.AttemptEnded, events.Finished, events.Stopped, events.Paused)
    if any(isinstance(e, closing) for e in view.rows):
        return None
    if view.attempt is None:  # a start that failed before `started` may be the user's after a stop
        windows.open_window(run, run.run_events(), job_id)
    where = events.Where(job_id=job_id, attempt=view.attempt, nodes=[socket.gethostname()])
    failed = [e for e in view.rows if isinstance(e, events.Failed)]
    # No exit code here (the supervisor's names a hang): rows that are all the watchdog's say hang.
    hung = any(e.cls == FailureClass.hang for e in failed)
    cls = ledger.classify(view.rows).cls or (FailureClass.hang if hung else FailureClass.crash)
    ended = events.AttemptEnded(
        cls=cls,
        exit_code=LOCAL_RC,
        step=next((e.step for e in failed if e.step is not None), None),
        before_started=True if view.attempt is None else None,
    )
    run.record(ended, **where)
    rows = merge_rows([run.run_events(), view.rank])
    stop = ledger.over_budget(rows, cfg.faults)
    if stop is None and events.restarts(cls):
        return None
    real = ledger.real_errors([e for e in failed if e.error]) or [e for e in failed if e.error]
    error = ledger.stop_detail(rows, cfg.faults, stop or cls) or (
        real[-1].error.strip().splitlines()[-1] if real else f"{stop or cls} budget exhausted"
    )
    stopped = events.Stopped(cls=stop or cls, error=error)
    run.record(stopped, **where)
    return stopped
