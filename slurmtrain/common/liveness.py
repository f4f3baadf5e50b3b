"""Whether a run's owner still lives: its Slurm job (squeue, then sacct) or its local process.

Fail closed: when Slurm cannot be asked, StateUnknown, never a guess (RunDir.state, the login
side's check-and-submit and rank 0's claim all refuse rather than train a run twice).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Optional

from slurmtrain.common.errors import ConfigError

# squeue/sacct states of a job that will still run (or is running): resubmitting would duplicate it.
ACTIVE_SLURM_STATES = set(
    "PENDING RUNNING CONFIGURING COMPLETING REQUEUED REQUEUE_FED REQUEUE_HOLD RESIZING "
    "SUSPENDED STAGE_OUT SIGNALING".split()
)


class StateUnknown(ConfigError):
    """Slurm could not be asked whether the run's job is alive: refuse rather than guess."""


def job_alive(rows: list[dict[str, Any]]) -> bool:
    """Whether the run's owner (its newest submission or start) is still queued or running (Slurm)
    or its process lives (local). Raises StateUnknown when neither squeue nor sacct answers."""
    from slurmtrain.common.ledger import owner

    last = owner(rows)
    if last is None:
        return False
    if _executor(rows, last) == "local":
        return _local_alive(rows, last)
    alive = slurm_job_alive(str(last.get("job_id")))
    if alive is None:
        raise StateUnknown(
            f"cannot tell whether job {last.get('job_id')}, which holds this run, is still queued "
            f"or running: neither squeue nor sacct answered; nothing submitted (try again when "
            f"Slurm answers)"
        )
    return alive


def _executor(rows: list[dict[str, Any]], last: dict[str, Any]) -> str:
    if last.get("executor"):
        return str(last["executor"])
    subs = [r for r in rows if r["event"] == "submitted" and r.get("job_id") == last.get("job_id")]
    if subs and subs[-1].get("executor"):
        return str(subs[-1]["executor"])
    return "slurm" if str(last.get("job_id")).replace("_", "").isdigit() else "local"


def _local_alive(rows: list[dict[str, Any]], last: dict[str, Any]) -> bool:
    if last["event"] != "submitted":  # a local start: its submission carries the pid
        subs = [
            r for r in rows if r["event"] == "submitted" and r.get("job_id") == last.get("job_id")
        ]
        if not subs:
            return False
        last = subs[-1]
    pid = last.get("pid")
    if last.get("host") != socket.gethostname() or not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, PermissionError):
        return False
    return pid_start(int(pid)) == last.get("pid_start")


def slurm_job_alive(job_id: str) -> Optional[bool]:
    """True while Slurm will still run the job (queued, running, requeued), False once it ended
    or Slurm has forgotten it, None when neither squeue nor sacct can be asked (fail closed)."""
    from slurmtrain.common import slurm_cmd
    from slurmtrain.common.slurm_text import SlurmError

    try:
        return slurm_cmd.job_state(job_id, strict=True) in ACTIVE_SLURM_STATES
    except SlurmError:
        return None


def pid_start(pid: int) -> Optional[str]:
    """The process start time: tells our pid from a recycled one."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
