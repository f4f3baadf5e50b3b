"""Failure budgets and the one classification of how an attempt ended, read from the ledger.

Every attempt ends with exactly one `AttemptEnded` row (its `cls`): written by the batch-shell
supervisor (slurmtrain.batch.supervise) when the step exits, or, for an attempt that vanished
(Slurm requeued the job itself), by the next attempt as it starts. Both decide the class with
`classify`. Budgets count those rows within the run's current budget window (common/windows.py).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence, Union

from slurmtrain.common import errors, events, progress
from slurmtrain.common.events import (
    EXIT_CLASS,
    FAILURE_CLASSES,
    FailureClass,
    R,
    Row,
)
from slurmtrain.common.windows import (  # re-exported: readers find budget windows here too
    Recorder as Recorder,
)
from slurmtrain.common.windows import (
    current_stop as current_stop,
)
from slurmtrain.common.windows import (
    new_window as new_window,
)
from slurmtrain.common.windows import (
    open_window as open_window,
)
from slurmtrain.common.windows import (
    user_submission as user_submission,
)
from slurmtrain.common.windows import (
    window,
)

if TYPE_CHECKING:  # start-up speed: the config schema (OmegaConf) only for the type checker
    from slurmtrain.common.schema import FaultsConfig

# transitional: deleted once callers use FailureClass
PREEMPTED = FailureClass.preempted.value
TIMED_OUT = FailureClass.timed_out.value
NODE_FAILURE = FailureClass.node_failure.value
HANG = FailureClass.hang.value
CRASH = FailureClass.crash.value
CONFIG_ERROR = FailureClass.config_error.value
OOM = FailureClass.oom.value
DIVERGED = FailureClass.diverged.value
CHECKPOINT_UNREADABLE = FailureClass.checkpoint_unreadable.value
CANCELLED = FailureClass.cancelled.value

# A failure class as a row holds it: one this version knows, or a newer version's string.
Class = Union[FailureClass, str]

# The rows that close an attempt (the newest `Started` without one is still open).
CLOSING = (events.AttemptEnded, events.Finished, events.Stopped, events.Paused)


def failure_class(cls: str) -> Class:
    """A row's class string as a FailureClass (a newer version's unknown class kept as written)."""
    try:
        return FailureClass(cls)
    except ValueError:
        return cls


def budgets(faults_cfg: FaultsConfig) -> dict[FailureClass, int]:
    return {cls: int(getattr(faults_cfg, events.budget_key(cls))) for cls in FAILURE_CLASSES}


def ended_classes(rows: Sequence[Row]) -> Counter[str]:
    """Attempts ended per class in the current budget window."""
    return Counter(e.cls for e in window(rows) if isinstance(e, events.AttemptEnded))


def over_budget(rows: Sequence[Row], faults_cfg: FaultsConfig) -> Optional[str]:
    """The class whose budget the run has exceeded (or a crash loop) in the current budget
    window, else None."""
    rows = window(rows)
    counts = ended_classes(rows)
    for cls, limit in budgets(faults_cfg).items():
        if limit >= 0 and counts.get(cls, 0) > limit:
            return cls.value
    ended = [e for e in rows if isinstance(e, events.AttemptEnded)]
    loop = int(faults_cfg.crash_loop)
    tail = ended[-loop:] if loop > 0 else []
    if len(tail) == loop and all(e.cls == FailureClass.crash for e in tail):
        steps = {e.step for e in tail}
        if len(steps) == 1 and None not in steps:
            return f"{FailureClass.crash.value} loop"
    if progress.no_progress(rows, int(faults_cfg.max_no_progress_attempts)) is not None:
        return FailureClass.no_progress.value
    return None


def stop_detail(rows: Sequence[Row], faults_cfg: FaultsConfig, stop: str) -> Optional[str]:
    """The `stopped` row's error a stop class carries itself (no_progress: the classes seen and
    the step with no checkpoint since), else None: the caller records the last error."""
    found = progress.no_progress(rows, int(faults_cfg.max_no_progress_attempts))
    return found.describe() if stop == FailureClass.no_progress and found else None


def rollbacks(rows: Sequence[Row]) -> list[events.Rollback]:
    """The in-process rollbacks after divergence, over every attempt of the budget window."""
    return [e for e in window(rows) if isinstance(e, events.Rollback)]


def rolled_back_to(rows: Sequence[Row]) -> set[int]:
    """The steps rollbacks returned to: never pruned, since a repeated divergence may need them."""
    return {e.to_step for e in rollbacks(rows) if e.to_step is not None}


def resume_request(rows: Sequence[Row], resume: str) -> str:
    """`resume` as the next attempt must apply it: none/step_N only once after the submission
    that asked for it (its `ResumeApplied` row), else auto; the config keeps the key."""
    if resume == "auto":
        return "auto"
    subs = [i for i, e in enumerate(rows) if isinstance(e, events.Submitted) and not e.requeue_of]
    since = subs[-1] if subs else 0
    if any(isinstance(e, events.ResumeApplied) for e in rows[since:]):
        return "auto"
    return resume


def published_since_reset(rows: Sequence[Row]) -> list[events.CheckpointSaved]:
    """`CheckpointSaved` rows that still count: after the last `ResumeApplied` (which moved the
    checkpoints it did not keep aside; the step it kept counts as saved)."""
    resets = [(i, e) for i, e in enumerate(rows) if isinstance(e, events.ResumeApplied)]
    start = resets[-1][0] + 1 if resets else 0
    saved = [e for e in rows[start:] if isinstance(e, events.CheckpointSaved)]
    if resets and resets[-1][1].kept_step is not None:
        saved.insert(0, events.CheckpointSaved(step=resets[-1][1].kept_step))
    return saved


def last_error(rows: Sequence[Row], attempt: Optional[int] = None) -> Optional[str]:
    """The last error line recorded by any rank (of one attempt, if given)."""
    found = [
        e
        for e in rows
        if isinstance(e, events.Failed) and (attempt is None or e.attempt == attempt) and e.error
    ]
    return found[-1].error.strip().splitlines()[-1] if found else None


def unended_attempt(rows: Sequence[Row]) -> Optional[events.Started]:
    """The newest `Started` row whose attempt has no closing row (ended, finished, stopped,
    paused)."""
    started = [e for e in rows if isinstance(e, events.Started)]
    if not started:
        return None
    last = started[-1]
    if any(isinstance(e, CLOSING) and e.attempt == last.attempt for e in rows):
        return None
    return last


@dataclass(frozen=True)
class Classified:
    """What an attempt's own rows say about how it ended: the class (None: nothing in them
    explains it; the caller asks Slurm or assumes a node died) and, for an OOM or a device
    error, the rows that show it (their nodes are named)."""

    cls: Optional[Class]
    rows: list[events.Failed] = field(default_factory=list)


def classify(rows: Sequence[Row], rc: Optional[int] = None) -> Classified:
    """How one attempt ended, from its `Failed` and `Signal` rows: the one decision both the
    supervisor (with the step's exit code `rc`) and the next attempt (an attempt that vanished,
    `rc` None) make.

    Vanished: SIGTERM first means preemption (Slurm requeued the job itself), SIGINT a Ctrl-C.
    The `Signal` row is written when the ranks agree to stop, before their save, so a save that
    outlasts GraceTime still leaves it. An exit code that names its class wins (a hang's code
    still looks at the rows). A real error outranks hang rows and peers' communication errors:
    an OOM is `oom`, a local CUDA/NCCL/ECC error a node failure, anything else its row's class."""
    if rc is None:
        signals = [e.signal for e in rows if isinstance(e, events.Signal)]
        if "SIGTERM" in signals:
            return Classified(FailureClass.preempted)
        if "SIGINT" in signals:
            return Classified(FailureClass.cancelled)
    elif rc in EXIT_CLASS and rc != errors.EXIT_HANG:
        return Classified(failure_class(EXIT_CLASS[rc]))
    real = real_errors([e for e in rows if isinstance(e, events.Failed)])
    oom = [e for e in real if is_oom(e)]
    if oom:
        return Classified(FailureClass.oom, oom)
    device = [e for e in real if is_device_error(e)]
    if device:
        return Classified(FailureClass.node_failure, device)
    if real:
        return Classified(failure_class(real[0].cls) if real[0].cls else FailureClass.crash)
    return Classified(None)


def vanished_class(rows: Sequence[Row], attempt: Optional[int]) -> Class:
    """Why an attempt ended without telling anyone (`classify`); no error of its own: the job
    was requeued under us, so a node failed."""
    mine = [e for e in rows if e.attempt == attempt]
    return classify(mine).cls or FailureClass.node_failure


PEER_ERRORS = (
    "Connection closed",
    "Connection reset",
    "Broken pipe",
    "NCCL",
    "gloo",
    "Connection refused",
    "timed out",
    "Timeout",
    "peer",
    "ProcessGroup",
)
# Errors of this process's own device or memory: the cause is here, not at a peer.
OOM_ERRORS = re.compile(
    r"OutOfMemoryError|CUDA out of memory|DefaultCPUAllocator: can't allocate|out of memory",
    re.IGNORECASE,
)
DEVICE_ERRORS = re.compile(
    r"unhandled cuda error|\bECC\b|\bXid\b|illegal memory access|uncorrectable|"
    r"CUDA error: (?!out of memory)|sees no CUDA device|no CUDA GPUs are available|"
    r"CUDA driver initialization failed",
    re.IGNORECASE,
)


def is_oom(row: events.Failed) -> bool:
    return bool(OOM_ERRORS.search(row.error))


def is_device_error(row: events.Failed) -> bool:
    """A local CUDA/NCCL/ECC failure: the node that recorded it is sick (exclude it)."""
    return not is_oom(row) and bool(DEVICE_ERRORS.search(row.error))


def _is_peer(row: events.Failed) -> bool:
    return not is_oom(row) and not is_device_error(row) and any(k in row.error for k in PEER_ERRORS)


def is_peer_error(failed: Sequence[events.Failed]) -> bool:
    """Every recorded error is a communication error: the cause is elsewhere (a dead peer/node).
    A local device error ("NCCL ... unhandled cuda error", ECC, Xid) or an OOM is not one."""
    return bool(failed) and all(_is_peer(e) for e in failed)


def real_errors(failed: Sequence[events.Failed]) -> list[events.Failed]:
    """Rows that name a cause of their own: not a hang, not a peer's communication error."""
    return [e for e in failed if e.cls != FailureClass.hang and not _is_peer(e)]


def row_node(row: Row, rows: Sequence[Row]) -> Optional[str]:
    """The node a rank's row came from: its `node` field, else the rank's host in `Started`."""
    if row.node:
        return row.node
    for e in reversed(rows):
        if isinstance(e, events.Started) and e.attempt == row.attempt:
            if row.rank is not None and 0 <= row.rank < len(e.hosts):
                return e.hosts[row.rank]
    return None


def restart_count(row: Row) -> int:
    """Slurm's restart count of the attempt a row belongs to (0 for rows written before it was)."""
    return row.restart or 0


def relaunch_count(row: Row) -> int:
    """In-allocation restarts of its job before the attempt a row belongs to (0 when none)."""
    return row.relaunch or 0


def attempt_key(row: Row) -> tuple[str, int, int]:
    """(job id, Slurm restart count, in-allocation relaunch) of the start a row belongs to: the
    rank tier keeps every rank's rows of one start in that key's folder (RunDir.rank_rows)."""
    return str(row.job_id), restart_count(row), relaunch_count(row)


def started_row(rows: Sequence[Row], attempt: Optional[int]) -> Optional[events.Started]:
    """The `Started` row of attempt number `attempt` (None when it has none)."""
    found = [e for e in rows if isinstance(e, events.Started) and e.attempt == attempt]
    return found[-1] if found else None


# Run-tier rows a start that never got as far as `Started` may leave (closed or refused early).
EARLY = (events.AttemptEnded, events.Failed, events.DuplicateRefused)


def newest_key(
    rows: Sequence[Row], among: Optional[set[str]] = None
) -> Optional[tuple[str, int, int]]:
    """The attempt key of the newest start the run tier names (a `Started`, or a start closed or
    refused before `Started`); `among`: only keys whose rank-tier folder name is in it."""
    from slurmtrain.common.jsonl import rank_key

    for e in reversed(rows):
        if isinstance(e, events.Started) or (
            isinstance(e, EARLY) and e.attempt is None and e.job_id
        ):
            key = attempt_key(e)
            if among is None or rank_key(*key) in among:
                return key
    return None


def attempt_of(
    rows: Sequence[Row], job_id: str, restart: Optional[int], relaunch: int = 0
) -> Optional[int]:
    """The attempt number of job `job_id` at Slurm restart `restart` (and in-allocation relaunch
    `relaunch`): its `Started` row. None when that start never got as far as `Started` (it
    failed in rendezvous, say): an earlier start of the same job id is another attempt, whose
    outcome is not this one's."""
    found = [e for e in rows if isinstance(e, events.Started) and str(e.job_id) == job_id]
    if restart is not None:
        found = [e for e in found if restart_count(e) == restart and relaunch_count(e) == relaunch]
    return found[-1].attempt if found else None


def attempt_rows(
    rows: Sequence[R],
    job_id: str,
    restart: int,
    attempt: Optional[int],
    relaunch: int = 0,
) -> list[R]:
    """One attempt's rows: by attempt number, or, for a start that never recorded `Started`, by
    job id, Slurm restart count and in-allocation relaunch (its `Failed` and `Signal` rows)."""
    if attempt is not None:
        return [e for e in rows if e.attempt == attempt]
    return [
        e
        for e in rows
        if e.attempt is None
        and str(e.job_id) == job_id
        and restart_count(e) == restart
        and relaunch_count(e) == relaunch
        and isinstance(e, (events.Failed, events.Signal))
    ]


def owner(rows: Sequence[Row]) -> Optional[events.Submitted | events.Started]:
    """The job that holds the run: the newest `Submitted` or `Started` row."""
    found = [e for e in rows if isinstance(e, (events.Submitted, events.Started)) and e.job_id]
    return found[-1] if found else None


def cancelled_since(rows: Sequence[Row], job_id: str, attempt: Optional[int]) -> bool:
    """A `Cancelled` row (slurmtrain.cli.cancel) after this job's attempt started (or after its
    submission, when the attempt never started)."""
    marks = [
        e
        for e in rows
        if isinstance(e, (events.Started, events.Submitted))
        and str(e.job_id) == job_id
        and (attempt is None or isinstance(e, events.Submitted) or e.attempt == attempt)
    ]
    cancels = [e for e in rows if isinstance(e, events.Cancelled)]
    if not marks:  # a hand-submitted job that never started: only a cancel naming it counts
        return any(job_id in e.job_ids for e in cancels)
    since = max(e.time for e in marks)
    return any(e.time >= since for e in cancels)


def close_cancelled(run: Recorder, job_ids: list[str], closed_by: str) -> None:
    """Close the open attempt of one of `job_ids` as `cancelled`: the user stopped it (scancel
    kills the batch shell before its supervisor runs; Ctrl-C on a local run). Left open, the next
    start would count it as a vanished preemption."""
    prev = unended_attempt(run.run_events())
    if prev is not None and str(prev.job_id) in job_ids:
        run.record(
            events.AttemptEnded(cls=FailureClass.cancelled, closed_by=closed_by),
            job_id=prev.job_id,
            attempt=prev.attempt,
            nodes=prev.nodes,
        )
