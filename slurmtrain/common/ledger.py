"""Failure budgets and the one classification of how an attempt ended, read from the ledger.

Every attempt ends with exactly one `attempt_ended{class}`: written by the batch-shell supervisor
(slurmtrain.batch.supervise) when the step exits, or, for an attempt that vanished (Slurm requeued
the job itself), by the next attempt as it starts. Both decide the class with `classify`. Budgets
count those rows within the run's current budget window (common/windows.py).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

from slurmtrain.common import errors, events
from slurmtrain.common.events import (
    EXIT_CLASS,
    FAILURE_CLASSES,
    FailureClass,
    R,
    Row,
)
from slurmtrain.common.schema import FaultsConfig
from slurmtrain.common.windows import (  # re-exported: readers find budget windows here too
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

# The classes as plain strings, as rows hold them (writers and readers across the code use them).
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


def budgets(faults_cfg: FaultsConfig) -> dict[FailureClass, int]:
    return {cls: int(getattr(faults_cfg, events.budget_key(cls))) for cls in FAILURE_CLASSES}


def ended_classes(rows: Sequence[Row]) -> Counter[str]:
    """Attempts ended per class in the current budget window."""
    return Counter(str(e["class"]) for e in window(rows) if e["event"] == "attempt_ended")


def over_budget(rows: Sequence[Row], faults_cfg: FaultsConfig) -> Optional[str]:
    """The class whose budget the run has exceeded (or a crash loop) in the current budget
    window, else None."""
    rows = window(rows)
    counts = ended_classes(rows)
    for cls, limit in budgets(faults_cfg).items():
        if limit >= 0 and counts.get(cls, 0) > limit:
            return str(cls)
    ended = [e for e in rows if e["event"] == "attempt_ended"]
    loop = int(faults_cfg.crash_loop)
    tail = ended[-loop:] if loop > 0 else []
    if len(tail) == loop and all(e["class"] == CRASH for e in tail):
        steps = {e.get("step") for e in tail}
        if len(steps) == 1 and None not in steps:
            return f"{CRASH} loop"
    return None


def rollbacks(rows: Sequence[R]) -> list[R]:
    """The in-process rollbacks after divergence, over every attempt of the budget window."""
    return [e for e in window(rows) if e["event"] == "rollback"]


def rolled_back_to(rows: Sequence[Row]) -> set[int]:
    """The steps rollbacks returned to: never pruned, since a repeated divergence may need them."""
    steps = (events.integer(e, "to_step") for e in rollbacks(rows))
    return {s for s in steps if s is not None}


def resume_request(rows: Sequence[Row], resume: str) -> str:
    """`resume` as the next attempt must apply it: none/step_N only once after the submission
    that asked for it (its `resume_applied` event), else auto; the config keeps the key."""
    if resume == "auto":
        return "auto"
    subs = [i for i, e in enumerate(rows) if e["event"] == "submitted" and not e.get("requeue_of")]
    since = subs[-1] if subs else 0
    if any(e["event"] == "resume_applied" for e in rows[since:]):
        return "auto"
    return resume


def published_since_reset(rows: Sequence[Row]) -> list[Row]:
    """`checkpoint_saved` events that still count: after the last `resume_applied` (which moved
    the checkpoints it did not keep aside)."""
    resets = [i for i, e in enumerate(rows) if e["event"] == "resume_applied"]
    start = resets[-1] + 1 if resets else 0
    saved = [e for e in rows[start:] if e["event"] == "checkpoint_saved"]
    if resets:
        kept = rows[resets[-1]].get("kept_step")
        if kept is not None:
            saved.insert(0, {"event": "checkpoint_saved", "step": kept})
    return saved


def last_error(rows: Sequence[Row], attempt: Optional[int] = None) -> Optional[str]:
    """The last error line recorded by any rank (of one attempt, if given)."""
    found = [
        e
        for e in rows
        if e["event"] == "failed"
        and (attempt is None or e.get("attempt") == attempt)
        and e.get("error")
    ]
    return str(found[-1]["error"]).strip().splitlines()[-1] if found else None


def unended_attempt(rows: Sequence[R]) -> Optional[R]:
    """The newest `started` event whose attempt has no `attempt_ended` and no `finished`."""
    started = [e for e in rows if e["event"] == "started"]
    if not started:
        return None
    last = started[-1]
    closing = {"attempt_ended", "finished", "stopped", "paused"}
    if any(e["event"] in closing and e.get("attempt") == last["attempt"] for e in rows):
        return None
    return last


@dataclass(frozen=True)
class Classified:
    """What an attempt's own rows say about how it ended: the class (None: nothing in them
    explains it; the caller asks Slurm or assumes a node died) and, for an OOM or a device
    error, the rows that show it (their nodes are named)."""

    cls: Optional[str]
    rows: list[Row] = field(default_factory=list)


def classify(rows: Sequence[Row], rc: Optional[int] = None) -> Classified:
    """How one attempt ended, from its `failed` and `signal` rows: the one decision both the
    supervisor (with the step's exit code `rc`) and the next attempt (an attempt that vanished,
    `rc` None) make.

    Vanished: SIGTERM first means preemption (Slurm requeued the job itself), SIGINT a Ctrl-C.
    The `signal` row is written when the ranks agree to stop, before their save, so a save that
    outlasts GraceTime still leaves it. An exit code that names its class wins (a hang's code
    still looks at the rows). A real error outranks hang rows and peers' communication errors:
    an OOM is `oom`, a local CUDA/NCCL/ECC error a node failure, anything else its row's class."""
    if rc is None:
        signals = [e.get("signal") for e in rows if e["event"] == "signal"]
        if "SIGTERM" in signals:
            return Classified(PREEMPTED)
        if "SIGINT" in signals:
            return Classified(CANCELLED)
    elif rc in EXIT_CLASS and rc != errors.EXIT_HANG:
        return Classified(EXIT_CLASS[rc])
    real = real_errors([e for e in rows if e["event"] == "failed"])
    oom = [e for e in real if is_oom(e)]
    if oom:
        return Classified(OOM, oom)
    device = [e for e in real if is_device_error(e)]
    if device:
        return Classified(NODE_FAILURE, device)
    if real:
        return Classified(events.text(real[0], "class") or CRASH)
    return Classified(None)


def vanished_class(rows: Sequence[Row], attempt: Optional[int]) -> str:
    """Why an attempt ended without telling anyone (`classify`); no error of its own: the job
    was requeued under us, so a node failed."""
    mine = [e for e in rows if e.get("attempt") == attempt]
    return classify(mine).cls or NODE_FAILURE


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


def _text(row: Row) -> str:
    return str(row.get("error", ""))


def is_oom(row: Row) -> bool:
    return bool(OOM_ERRORS.search(_text(row)))


def is_device_error(row: Row) -> bool:
    """A local CUDA/NCCL/ECC failure: the node that recorded it is sick (exclude it)."""
    return not is_oom(row) and bool(DEVICE_ERRORS.search(_text(row)))


def _is_peer(row: Row) -> bool:
    return (
        not is_oom(row) and not is_device_error(row) and any(k in _text(row) for k in PEER_ERRORS)
    )


def is_peer_error(failed: Sequence[Row]) -> bool:
    """Every recorded error is a communication error: the cause is elsewhere (a dead peer/node).
    A local device error ("NCCL ... unhandled cuda error", ECC, Xid) or an OOM is not one."""
    return bool(failed) and all(_is_peer(e) for e in failed)


def real_errors(failed: Sequence[R]) -> list[R]:
    """Rows that name a cause of their own: not a hang, not a peer's communication error."""
    return [e for e in failed if e.get("class") != HANG and not _is_peer(e)]


def row_node(row: Row, rows: Sequence[Row]) -> Optional[str]:
    """The node a rank's row came from: its `node` field, else the rank's host in `started`."""
    if row.get("node"):
        return str(row["node"])
    rank = row.get("rank")
    for e in reversed(rows):
        if e["event"] == "started" and e.get("attempt") == row.get("attempt"):
            hosts = events.strings(e, "hosts")
            if isinstance(rank, int) and 0 <= rank < len(hosts):
                return hosts[rank]
    return None


def restart_count(row: Row) -> int:
    """Slurm's restart count of the attempt a row belongs to (0 for rows written before it was)."""
    return events.integer(row, "restart") or 0


def relaunch_count(row: Row) -> int:
    """In-allocation restarts of its job before the attempt a row belongs to (0 when none)."""
    return events.integer(row, "relaunch") or 0


def attempt_key(row: Row) -> tuple[str, int, int]:
    """(job id, Slurm restart count, in-allocation relaunch) of the start a row belongs to: the
    rank tier keeps every rank's rows of one start in that key's folder (RunDir.rank_rows)."""
    return str(row.get("job_id")), restart_count(row), relaunch_count(row)


def started_row(rows: Sequence[R], attempt: Optional[int]) -> Optional[R]:
    """The `started` event of attempt number `attempt` (None when it has none)."""
    found = [e for e in rows if e["event"] == "started" and e.get("attempt") == attempt]
    return found[-1] if found else None


def newest_key(
    rows: Sequence[Row], among: Optional[set[str]] = None
) -> Optional[tuple[str, int, int]]:
    """The attempt key of the newest start the run tier names (a `started`, or a start closed or
    refused before `started`); `among`: only keys whose rank-tier folder name is in it."""
    from slurmtrain.common.jsonl import rank_key

    early = ("attempt_ended", "failed", "duplicate_refused")
    for e in reversed(rows):
        if e["event"] == "started" or (
            e["event"] in early and e.get("attempt") is None and e.get("job_id")
        ):
            key = attempt_key(e)
            if among is None or rank_key(*key) in among:
                return key
    return None


def attempt_of(
    rows: Sequence[Row], job_id: str, restart: Optional[int], relaunch: int = 0
) -> Optional[int]:
    """The attempt number of job `job_id` at Slurm restart `restart` (and in-allocation relaunch
    `relaunch`): its `started` event. None when that start never got as far as `started` (it
    failed in rendezvous, say): an earlier start of the same job id is another attempt, whose
    outcome is not this one's."""
    found = [e for e in rows if e["event"] == "started" and str(e.get("job_id")) == job_id]
    if restart is not None:
        found = [e for e in found if restart_count(e) == restart and relaunch_count(e) == relaunch]
    return events.integer(found[-1], "attempt") if found else None


def attempt_rows(
    rows: Sequence[R],
    job_id: str,
    restart: int,
    attempt: Optional[int],
    relaunch: int = 0,
) -> list[R]:
    """One attempt's rows: by attempt number, or, for a start that never recorded `started`, by
    job id, Slurm restart count and in-allocation relaunch."""
    if attempt is not None:
        return [e for e in rows if e.get("attempt") == attempt]
    return [
        e
        for e in rows
        if e.get("attempt") is None
        and str(e.get("job_id")) == job_id
        and restart_count(e) == restart
        and relaunch_count(e) == relaunch
        and e["event"] in ("failed", "signal")
    ]


def owner(rows: Sequence[R]) -> Optional[R]:
    """The job that holds the run: the newest `submitted` or `started` event."""
    found = [e for e in rows if e["event"] in ("submitted", "started") and e.get("job_id")]
    return found[-1] if found else None


def cancelled_since(rows: Sequence[Row], job_id: str, attempt: Optional[int]) -> bool:
    """A `cancelled` event (slurmtrain.cli.cancel) after this job's attempt started (or after its
    submission, when the attempt never started)."""
    marks = [
        e
        for e in rows
        if e["event"] in ("started", "submitted")
        and str(e.get("job_id")) == job_id
        and (attempt is None or e["event"] == "submitted" or e.get("attempt") == attempt)
    ]
    if not marks:  # a hand-submitted job that never started: only a cancel naming it counts
        return any(
            e["event"] == "cancelled" and job_id in events.strings(e, "job_ids") for e in rows
        )
    since = max(events.number(e, "time") for e in marks)
    return any(e["event"] == "cancelled" and events.number(e, "time") >= since for e in rows)


def close_cancelled(run: events.Recorder, job_ids: list[str], closed_by: str) -> None:
    """Close the open attempt of one of `job_ids` as `cancelled`: the user stopped it (scancel
    kills the batch shell before its supervisor runs; Ctrl-C on a local run). Left open, the next
    start would count it as a vanished preemption."""
    prev = unended_attempt(run.run_events())
    if prev is not None and str(prev.get("job_id")) in job_ids:
        run.record(
            events.attempt_ended(CANCELLED, closed_by=closed_by),
            job_id=events.text(prev, "job_id"),
            attempt=events.integer(prev, "attempt"),
            nodes=events.strings(prev, "nodes"),
        )
