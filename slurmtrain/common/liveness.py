"""Whether a run's owner still lives: its Slurm job (squeue, then sacct) or its local process.

Fail closed: when Slurm cannot be asked, StateUnknown, never a guess (RunDir.state, the login
side's check-and-submit and rank 0's claim all refuse rather than train a run twice).

A held owner does not wedge the run: the supervisor submits its successor held, records it, then
releases it; killed in between (or refused the release), it leaves a PENDING job nobody starts.
Such an owner still held $SLURMTRAIN_HELD_OWNER_S (300 s) after its `submitted` row is released
here, or, when it stays held, cancelled and treated as dead (status and the launch command both
ask, so either one un-wedges the run).

Many runs at once (`cli status` over a sweep): `batch(job_ids)` asks Slurm once for all of them
(`squeue -j a,b,...`, then one `sacct` if squeue cannot be asked); inside it `slurm_job_alive` and
`held` answer from that listing instead of one squeue per run.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence, Union

from slurmtrain.common import events, slurm_cmd
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.ledger import owner
from slurmtrain.common.slurm_text import SlurmError

Owner = Union[events.Submitted, events.Started]  # the row of the job that holds a run (owner)

HELD_OWNER_ENV = "SLURMTRAIN_HELD_OWNER_S"
# Longer than a supervisor's own release with retries (Slurm's 180 s retry budget + ~15 s).
DEFAULT_HELD_OWNER_S = 300.0
# squeue/sacct states of a job that will still run (or is running): resubmitting would duplicate it.
ACTIVE_SLURM_STATES = set(
    "PENDING RUNNING CONFIGURING COMPLETING REQUEUED REQUEUE_FED REQUEUE_HOLD RESIZING "
    "SUSPENDED STAGE_OUT SIGNALING".split()
)


class StateUnknown(ConfigError):
    """Slurm could not be asked whether the run's job is alive: refuse rather than guess."""


# Inside `batch`: job id -> (state, reason) as one listing gave them; ABSENT for a job Slurm no
# longer lists (ended), UNKNOWN when neither squeue nor sacct answered.
_listed: dict[str, tuple[str, str]] = {}
ABSENT, UNKNOWN = ("", ""), ("?", "")
BATCH_IDS = 2000  # job ids per call: the -j argument stays far below the 128 KiB argument limit


@contextlib.contextmanager
def batch(job_ids: Iterable[str]) -> Iterator[None]:
    """Ask Slurm about every job in `job_ids` at once (one squeue per 2,000 ids; one sacct more
    only if squeue cannot be asked); `slurm_job_alive` and `held` answer from it until the block
    ends. A job squeue does not list has ended (squeue lists every job in any state once -j
    names it, until the controller forgets it)."""
    ids = sorted({str(j) for j in job_ids if j} - set(_listed))
    for start in range(0, len(ids), BATCH_IDS):
        _listed.update(_listing(ids[start : start + BATCH_IDS]))
    try:
        yield
    finally:
        for job in ids:
            _listed.pop(job, None)


def slurm_owner(rows: Sequence[events.Row]) -> Optional[str]:
    """The Slurm job id `job_alive` would ask about for these ledger rows (None: no owner, a
    local run, or a finished one): what a caller collects for `batch`."""
    last = owner(rows)
    if last is None or any(isinstance(r, events.Finished) for r in rows):
        return None
    return None if _executor(rows, last) == "local" else str(last.job_id)


def _listing(ids: list[str]) -> dict[str, tuple[str, str]]:
    found = dict.fromkeys(ids, ABSENT)
    try:
        out = slurm_cmd.run(["squeue", "-h", "-r", "-j", ",".join(ids), "-o", "%i|%T|%r"])
    except SlurmError as err:
        if "invalid job id" in str(err).lower():  # one id asked, and the controller forgot it
            return found
        try:
            out = slurm_cmd.run(
                ["sacct", "-n", "-X", "-P", "-j", ",".join(ids), "-o", "JobID,State"]
            )
        except SlurmError:
            return dict.fromkeys(ids, UNKNOWN)
        for line in out.splitlines():  # "CANCELLED by 0" -> CANCELLED; a later row wins
            job, _, state = line.strip().partition("|")
            if job in found and state.split():
                found[job] = (state.split()[0], "")
        return found
    for line in out.splitlines():
        job, state, reason = (line.strip().split("|") + ["", ""])[:3]
        if job in found:
            found[job] = (state.strip(), reason.strip())
    return found


def job_alive(rows: Sequence[events.Row]) -> bool:
    """Whether the run's owner (its newest submission or start) is still queued or running (Slurm)
    or its process lives (local). Raises StateUnknown when neither squeue nor sacct answers."""
    last = owner(rows)
    if last is None:
        return False
    if _executor(rows, last) == "local":
        return _local_alive(rows, last)
    alive = slurm_job_alive(str(last.job_id))
    if alive is None:
        raise StateUnknown(
            f"cannot tell whether job {last.job_id}, which holds this run, is still queued "
            f"or running: neither squeue nor sacct answered; nothing submitted (try again when "
            f"Slurm answers)"
        )
    if alive and _held_too_long(last):
        return _unwedge(str(last.job_id))
    return alive


def held_owner_s() -> float:
    try:
        return max(0.0, float(os.environ.get(HELD_OWNER_ENV, DEFAULT_HELD_OWNER_S)))
    except ValueError:
        return DEFAULT_HELD_OWNER_S


def held(job_id: str) -> Optional[bool]:
    """Whether Slurm holds the job (PENDING, reason JobHeldUser/JobHeldAdmin); False once it is
    released, running or gone; None when squeue cannot be asked."""
    if str(job_id) in _listed:
        listed = _listed[str(job_id)]
        return (
            None
            if listed == UNKNOWN
            else listed[0] == "PENDING" and listed[1].startswith("JobHeld")
        )
    try:
        out = slurm_cmd.run(["squeue", "-h", "-j", str(job_id), "-o", "%T|%r"])
    except SlurmError as err:
        return False if "invalid job id" in str(err).lower() else None
    state, _, reason = out.strip().partition("|")
    return state == "PENDING" and reason.strip().startswith("JobHeld")


def _held_too_long(last: Owner) -> bool:
    """The owner is the supervisor's held successor (`requeue_of`), recorded longer ago than the
    bound and still held: one squeue, asked only of such an owner."""
    if not isinstance(last, events.Submitted) or not last.requeue_of:
        return False  # a user's own hold on a job they submitted is theirs to lift
    if time.time() - last.time < held_owner_s():
        return False
    return held(str(last.job_id)) is True


def _unwedge(job_id: str) -> bool:
    """Release a wedged held owner: alive once it is no longer held; else cancel it (it must never
    start beside the job that replaces it) and report it dead."""
    try:
        slurm_cmd.run(["scontrol", "release", job_id])
    except SlurmError as err:
        print(f"slurmtrain: scontrol release {job_id}: {err}", file=sys.stderr)
    _listed.pop(str(job_id), None)  # a batch's listing predates the release: ask Slurm again
    if held(job_id) is False:
        print(f"slurmtrain: released job {job_id}: its supervisor left it held", file=sys.stderr)
        return True
    try:
        slurm_cmd.run(["scancel", job_id])
    except SlurmError as err:
        print(f"slurmtrain: scancel {job_id}: {err}", file=sys.stderr)
    print(f"slurmtrain: job {job_id} stays held: treated as ended (cancelled)", file=sys.stderr)
    return False


def _submissions(rows: Sequence[events.Row], last: Owner) -> list[events.Submitted]:
    """The `Submitted` rows of the owner's job."""
    return [r for r in rows if isinstance(r, events.Submitted) and r.job_id == last.job_id]


def _executor(rows: Sequence[events.Row], last: Owner) -> str:
    if last.executor:
        return last.executor
    subs = _submissions(rows, last)
    if subs and subs[-1].executor:
        return subs[-1].executor
    return "slurm" if str(last.job_id).replace("_", "").isdigit() else "local"


def _local_alive(rows: Sequence[events.Row], last: Owner) -> bool:
    if isinstance(last, events.Submitted):
        sub = last
    else:  # a local start: its submission carries the pid
        subs = _submissions(rows, last)
        if not subs:
            return False
        sub = subs[-1]
    pid = sub.pid
    if sub.host != socket.gethostname() or not pid:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return pid_start(pid) == sub.pid_start


def slurm_job_alive(job_id: str) -> Optional[bool]:
    """True while Slurm will still run the job (queued, running, requeued), False once it ended
    or Slurm has forgotten it, None when neither squeue nor sacct can be asked (fail closed)."""
    if str(job_id) in _listed:  # inside `batch`
        listed = _listed[str(job_id)]
        return None if listed == UNKNOWN else listed[0] in ACTIVE_SLURM_STATES
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
