"""One run, one job: rank 0 claims the run before training, or refuses while another job holds it.

The ledger's newest `submitted`/`started` event names the run's owner. A job that is not the owner
trains only once Slurm says the owner is gone (ended, or forgotten); while the owner lives, the
newcomer records `duplicate_refused` and exits with EXIT_DUPLICATE, before touching checkpoints.
The check and this attempt's `started` event are made under the run's lock (RunDir.locked), so two
jobs starting at once cannot both see the run free. When Slurm cannot be asked, the attempt fails
(class crash, within its budget) instead of guessing.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from slurmtrain.common import ledger
from slurmtrain.common.rundir import RunDir, slurm_job_alive

FREE, DUPLICATE, UNKNOWN = "free", "duplicate", "unknown"


def my_job_ids(env: Mapping[str, str] = os.environ) -> set[str]:
    """Every name this job goes by in the ledger: its id, and `ARRAYID_TASK` in a job array."""
    ids = {env["SLURM_JOB_ID"]} if env.get("SLURM_JOB_ID") else set()
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        ids.add(f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}")
    return ids


def under_slurm(env: Mapping[str, str] = os.environ) -> bool:
    return bool(env.get("SLURM_JOB_ID")) and "SUBMITIT_LOCAL_JOB_ID" not in env


def check(
    run: RunDir, mine: set[str], events: Optional[list[dict[str, Any]]] = None
) -> tuple[str, Optional[dict[str, Any]]]:
    """(FREE | DUPLICATE | UNKNOWN, the owner's ledger row). Call under run.locked().
    `events`: the run tier when the caller has read it (owners live there: `submitted`,
    `started`; no rank's row is read)."""
    events = run.run_events() if events is None else events
    # A job queued to start after this one (smoke chain: `after`; a time-limit restart) waits for
    # it to end: it is the next owner, not a competitor.
    rows = [e for e in events if str(e.get("after") or "") not in mine]
    own = ledger.owner(rows)
    if own is None or str(own.get("job_id")) in mine or own.get("executor") == "local":
        return FREE, own
    alive = slurm_job_alive(str(own["job_id"]))
    if alive is None:
        alive = slurm_job_alive(str(own["job_id"]))  # once more: a busy controller
    if alive is False:
        return FREE, own
    return (DUPLICATE if alive else UNKNOWN), own
