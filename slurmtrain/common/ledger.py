"""Failure classes and budgets: deciding, from the ledger, whether a run goes on.

Every attempt ends with exactly one `attempt_ended{class}` event: written by the batch-shell
supervisor (slurmtrain.batch.supervise) when the job step exits, or, for attempts that vanished
(Slurm requeued the job itself after a preemption or a node failure), by the next attempt when it
starts. Budgets count those events within the run's current budget window: a user's resubmission
after a `stopped` (the same command, or `sbatch job.sbatch` by hand) opens a new one, recorded as
`budget_window` with the reason the run stopped before; automatic restarts (the supervisor's
resubmissions and requeues, Slurm's requeues, in-allocation relaunches) keep counting.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Optional

from slurmtrain.common.errors import (
    EXIT_BAD_NODE,
    EXIT_CONFIG,
    EXIT_HANG,
    EXIT_REQUEUE,
)
from slurmtrain.common.windows import (  # noqa: F401  budget windows; shared through this module
    current_stop,
    new_window,
    open_window,
    user_submission,
    window,
)

PREEMPTED, TIMED_OUT, NODE_FAILURE, HANG, CRASH, CONFIG_ERROR = (
    "preempted",
    "timed_out",
    "node_failure",
    "hang",
    "crash",
    "config_error",
)
# Recorded by the attempt itself as `stopped` (never restarted): the loss kept diverging after
# rollbacks (faults.max_rollback), or the run published checkpoints and none validates now.
DIVERGED, CHECKPOINT_UNREADABLE = "diverged", "checkpoint_unreadable"
OOM = "oom"  # its own budget (faults.max_oom): a memory plan that does not fit will not heal
CANCELLED = "cancelled"  # the user stopped it (scancel, cli cancel, Ctrl-C): no budget, no restart
FAILURE_CLASSES = (
    PREEMPTED,
    TIMED_OUT,
    NODE_FAILURE,
    HANG,
    CRASH,
    CONFIG_ERROR,
    OOM,
    DIVERGED,
    CHECKPOINT_UNREADABLE,
)
EXIT_CLASS = {
    EXIT_REQUEUE: TIMED_OUT,
    EXIT_BAD_NODE: NODE_FAILURE,
    EXIT_HANG: HANG,
    EXIT_CONFIG: CONFIG_ERROR,
}


def budgets(faults_cfg: Any) -> dict[str, int]:
    return {cls: int(getattr(faults_cfg, f"max_{cls}")) for cls in FAILURE_CLASSES}


def ended_classes(events: list[dict[str, Any]]) -> Counter:
    """Attempts ended per class in the current budget window."""
    return Counter(e["class"] for e in window(events) if e["event"] == "attempt_ended")


def over_budget(events: list[dict[str, Any]], faults_cfg: Any) -> Optional[str]:
    """The class whose budget the run has exceeded (or a crash loop) in the current budget
    window, else None."""
    events = window(events)
    counts = ended_classes(events)
    for cls, limit in budgets(faults_cfg).items():
        if limit >= 0 and counts.get(cls, 0) > limit:
            return cls
    ended = [e for e in events if e["event"] == "attempt_ended"]
    loop = int(faults_cfg.crash_loop)
    tail = ended[-loop:] if loop > 0 else []
    if len(tail) == loop and all(e["class"] == CRASH for e in tail):
        steps = {e.get("step") for e in tail}
        if len(steps) == 1 and None not in steps:
            return f"{CRASH} loop"
    return None


def rollbacks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The in-process rollbacks after divergence, over every attempt of the budget window."""
    return [e for e in window(events) if e["event"] == "rollback"]


def rolled_back_to(events: list[dict[str, Any]]) -> set[int]:
    """The steps rollbacks returned to: never pruned, since a repeated divergence may need them."""
    return {int(e["to_step"]) for e in rollbacks(events) if e.get("to_step") is not None}


def resume_request(events: list[dict[str, Any]], resume: str) -> str:
    """`resume` as the next attempt must apply it: none/step_N only once after the submission
    that asked for it (its `resume_applied` event), else auto; the config keeps the key."""
    if resume == "auto":
        return "auto"
    subs = [
        i for i, e in enumerate(events) if e["event"] == "submitted" and not e.get("requeue_of")
    ]
    since = subs[-1] if subs else 0
    if any(e["event"] == "resume_applied" for e in events[since:]):
        return "auto"
    return resume


def published_since_reset(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`checkpoint_saved` events that still count: after the last `resume_applied` (which moved
    the checkpoints it did not keep aside)."""
    resets = [i for i, e in enumerate(events) if e["event"] == "resume_applied"]
    start = resets[-1] + 1 if resets else 0
    saved = [e for e in events[start:] if e["event"] == "checkpoint_saved"]
    if resets:
        kept = events[resets[-1]].get("kept_step")
        if kept is not None:
            saved.insert(0, {"event": "checkpoint_saved", "step": kept})
    return saved


def last_error(events: list[dict[str, Any]], attempt: Optional[int] = None) -> Optional[str]:
    """The last error line recorded by any rank (of one attempt, if given)."""
    rows = [
        e
        for e in events
        if e["event"] == "failed"
        and (attempt is None or e.get("attempt") == attempt)
        and e.get("error")
    ]
    return str(rows[-1]["error"]).strip().splitlines()[-1] if rows else None


def unended_attempt(events: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The newest `started` event whose attempt has no `attempt_ended` and no `finished`."""
    started = [e for e in events if e["event"] == "started"]
    if not started:
        return None
    last = started[-1]
    closing = {"attempt_ended", "finished", "stopped", "paused"}
    if any(e["event"] in closing and e.get("attempt") == last["attempt"] for e in events):
        return None
    return last


def vanished_class(events: list[dict[str, Any]], attempt: int) -> str:
    """Why an attempt ended without telling anyone: SIGTERM first means preemption (Slurm requeued
    the job itself); a real error is its own class; otherwise the job was requeued under us: a
    node failed. The `signal` event is recorded when the ranks agree to stop, before their save, so
    a save that outlasts GraceTime (Slurm kills the job mid-save) still leaves it."""
    signals = [e for e in events if e["event"] == "signal" and e.get("attempt") == attempt]
    if any(e.get("signal") == "SIGTERM" for e in signals):
        return PREEMPTED
    if any(e.get("signal") == "SIGINT" for e in signals):
        return CANCELLED  # Ctrl-C, and the command that would have closed it was killed
    errors = [e for e in events if e["event"] == "failed" and e.get("attempt") == attempt]
    real = real_errors(errors)
    if real:
        if any(is_oom(e) for e in real):
            return OOM
        if any(is_device_error(e) for e in real):
            return NODE_FAILURE
        return real[0].get("class") or CRASH
    return NODE_FAILURE


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


def _text(row: dict[str, Any]) -> str:
    return str(row.get("error", ""))


def is_oom(row: dict[str, Any]) -> bool:
    return bool(OOM_ERRORS.search(_text(row)))


def is_device_error(row: dict[str, Any]) -> bool:
    """A local CUDA/NCCL/ECC failure: the node that recorded it is sick (exclude it)."""
    return not is_oom(row) and bool(DEVICE_ERRORS.search(_text(row)))


def _is_peer(row: dict[str, Any]) -> bool:
    return (
        not is_oom(row) and not is_device_error(row) and any(k in _text(row) for k in PEER_ERRORS)
    )


def is_peer_error(failed: list[dict[str, Any]]) -> bool:
    """Every recorded error is a communication error: the cause is elsewhere (a dead peer/node).
    A local device error ("NCCL ... unhandled cuda error", ECC, Xid) or an OOM is not one."""
    return bool(failed) and all(_is_peer(e) for e in failed)


def real_errors(failed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows that name a cause of their own: not a hang, not a peer's communication error."""
    return [e for e in failed if e.get("class") != HANG and not _is_peer(e)]


def row_node(row: dict[str, Any], events: list[dict[str, Any]]) -> Optional[str]:
    """The node a rank's row came from: its `node` field, else the rank's host in `started`."""
    if row.get("node"):
        return str(row["node"])
    rank = row.get("rank")
    for e in reversed(events):
        if e["event"] == "started" and e.get("attempt") == row.get("attempt"):
            hosts = e.get("hosts") or []
            if isinstance(rank, int) and 0 <= rank < len(hosts):
                return str(hosts[rank])
    return None


def restart_count(row: dict[str, Any]) -> int:
    """Slurm's restart count of the attempt a row belongs to (0 for rows written before it was)."""
    try:
        return int(row.get("restart") or 0)
    except (TypeError, ValueError):
        return 0


def relaunch_count(row: dict[str, Any]) -> int:
    """In-allocation restarts of its job before the attempt a row belongs to (0 when none)."""
    try:
        return int(row.get("relaunch") or 0)
    except (TypeError, ValueError):
        return 0


def attempt_key(row: dict[str, Any]) -> tuple[str, int, int]:
    """(job id, Slurm restart count, in-allocation relaunch) of the start a row belongs to: the
    rank tier keeps every rank's rows of one start in that key's folder (RunDir.rank_rows)."""
    return str(row.get("job_id")), restart_count(row), relaunch_count(row)


def started_row(events: list[dict[str, Any]], attempt: Any) -> Optional[dict[str, Any]]:
    """The `started` event of attempt number `attempt` (None when it has none)."""
    rows = [e for e in events if e["event"] == "started" and e.get("attempt") == attempt]
    return rows[-1] if rows else None


def newest_key(
    events: list[dict[str, Any]], among: Optional[set[str]] = None
) -> Optional[tuple[str, int, int]]:
    """The attempt key of the newest start the run tier names (a `started`, or a start closed or
    refused before `started`); `among`: only keys whose rank-tier folder name is in it."""
    from slurmtrain.common.jsonl import rank_key

    early = ("attempt_ended", "failed", "duplicate_refused")
    for e in reversed(events):
        if e["event"] == "started" or (
            e["event"] in early and e.get("attempt") is None and e.get("job_id")
        ):
            key = attempt_key(e)
            if among is None or rank_key(*key) in among:
                return key
    return None


def attempt_of(
    events: list[dict[str, Any]], job_id: str, restart: Optional[int], relaunch: int = 0
) -> Optional[int]:
    """The attempt number of job `job_id` at Slurm restart `restart` (and in-allocation relaunch
    `relaunch`): its `started` event. None when that start never got as far as `started` (it
    failed in rendezvous, say): an earlier start of the same job id is another attempt, whose
    outcome is not this one's."""
    rows = [e for e in events if e["event"] == "started" and str(e.get("job_id")) == job_id]
    if restart is not None:
        rows = [e for e in rows if restart_count(e) == restart and relaunch_count(e) == relaunch]
    return rows[-1]["attempt"] if rows else None


def attempt_rows(
    events: list[dict[str, Any]],
    job_id: str,
    restart: int,
    attempt: Optional[int],
    relaunch: int = 0,
) -> list[dict[str, Any]]:
    """One attempt's rows: by attempt number, or, for a start that never recorded `started`, by
    job id, Slurm restart count and in-allocation relaunch."""
    if attempt is not None:
        return [e for e in events if e.get("attempt") == attempt]
    return [
        e
        for e in events
        if e.get("attempt") is None
        and str(e.get("job_id")) == job_id
        and restart_count(e) == restart
        and relaunch_count(e) == relaunch
        and e["event"] in ("failed", "signal")
    ]


def owner(events: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The job that holds the run: the newest `submitted` or `started` event."""
    rows = [e for e in events if e["event"] in ("submitted", "started") and e.get("job_id")]
    return rows[-1] if rows else None


def cancelled_since(events: list[dict[str, Any]], job_id: str, attempt: Optional[int]) -> bool:
    """A `cancelled` event (slurmtrain.cli.cancel) after this job's attempt started (or after its
    submission, when the attempt never started)."""
    marks = [
        e
        for e in events
        if e["event"] in ("started", "submitted")
        and str(e.get("job_id")) == job_id
        and (attempt is None or e["event"] == "submitted" or e.get("attempt") == attempt)
    ]
    if not marks:  # a hand-submitted job that never started: only a cancel naming it counts
        return any(
            e["event"] == "cancelled" and job_id in [str(j) for j in e.get("job_ids") or []]
            for e in events
        )
    since = max(float(e.get("time", 0)) for e in marks)
    return any(e["event"] == "cancelled" and float(e.get("time", 0)) >= since for e in events)


def close_cancelled(run: Any, job_ids: list[str], closed_by: str) -> None:
    """Close the open attempt of one of `job_ids` as `cancelled`: the user stopped it (scancel
    kills the batch shell before its supervisor runs; Ctrl-C on a local run). Left open, the next
    start would count it as a vanished preemption. `run`: a RunDir."""
    prev = unended_attempt(run.run_events())
    if prev is not None and str(prev.get("job_id")) in job_ids:
        run.record(
            "attempt_ended",
            job_id=prev.get("job_id"),
            attempt=prev["attempt"],
            nodes=prev.get("nodes", []),
            **{"class": CANCELLED, "closed_by": closed_by},
        )
