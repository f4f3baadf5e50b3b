"""Signals, failure classes and budgets: deciding, from the ledger, whether a run goes on.

A signal handler only sets a flag: saving from inside a handler (what submitit's `checkpoint()` does,
on rank 0 only) cannot write sharded ZeRO state. The loop agrees on the flags across ranks at each
step boundary and then all ranks act together.

Every attempt ends with exactly one `attempt_ended{class}` event: written by the batch-shell
supervisor (slurmtrain.supervise) when the job step exits, or, for attempts that vanished (Slurm
requeued the job itself after a preemption or a node failure), by the next attempt when it starts.
Budgets count those events across the whole run.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from types import FrameType
from typing import Any, Optional

NONE, TIME_LIMIT, TERMINATE = 0, 1, 2
PREEMPTED, TIMED_OUT, NODE_FAILURE, HANG, CRASH, CONFIG_ERROR = (
    "preempted", "timed_out", "node_failure", "hang", "crash", "config_error")
FAILURE_CLASSES = (PREEMPTED, TIMED_OUT, NODE_FAILURE, HANG, CRASH, CONFIG_ERROR)
# Exit codes of the job step that tell the batch shell what to do (it can always run scontrol,
# even when the job runs inside a container that has none).
EXIT_REQUEUE = 3  # time limit: everything saved, requeue me
EXIT_BAD_NODE = 4  # the health gate failed a node: exclude it and requeue
EXIT_HANG = 5  # the watchdog saw no progress: stacks dumped, requeue
EXIT_CONFIG = 2  # the run directory's config cannot run: never requeue
EXIT_TERMINATED = 6  # SIGTERM, saved: preempted (restart) or cancelled (stop); Slurm tells which
EXIT_CLASS = {EXIT_REQUEUE: TIMED_OUT, EXIT_BAD_NODE: NODE_FAILURE, EXIT_HANG: HANG,
              EXIT_CONFIG: CONFIG_ERROR}


class SignalFlags:
    """USR2 (Slurm's time-limit warning, --signal=USR2@lead) and TERM (preemption, scancel)."""

    def __init__(self) -> None:
        self.code = NONE
        self.received: Optional[str] = None
        self.received_at: Optional[float] = None

    def install(self) -> "SignalFlags":
        signal.signal(signal.SIGUSR2, self._handler)
        signal.signal(signal.SIGTERM, self._handler)
        return self

    def _handler(self, signum: int, _frame: Optional[FrameType]) -> None:
        code = TIME_LIMIT if signum == signal.SIGUSR2 else TERMINATE
        if code > self.code:
            self.code, self.received = code, signal.Signals(signum).name
            self.received_at = time.time()


def budgets(faults_cfg: Any) -> dict[str, int]:
    return {cls: int(getattr(faults_cfg, f"max_{cls}")) for cls in FAILURE_CLASSES}


def ended_classes(events: list[dict[str, Any]]) -> Counter:
    return Counter(e["class"] for e in events if e["event"] == "attempt_ended")


def over_budget(events: list[dict[str, Any]], faults_cfg: Any) -> Optional[str]:
    """The class whose budget the run has exceeded (or a crash loop), else None."""
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


def last_error(events: list[dict[str, Any]], attempt: Optional[int] = None) -> Optional[str]:
    """The last error line recorded by any rank (of one attempt, if given)."""
    rows = [e for e in events if e["event"] == "failed"
            and (attempt is None or e.get("attempt") == attempt) and e.get("error")]
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
    the job itself); otherwise the job was requeued under us: a node failed."""
    signals = [e for e in events if e["event"] == "signal" and e.get("attempt") == attempt]
    if any(e.get("signal") == "SIGTERM" for e in signals):
        return PREEMPTED
    errors = [e for e in events if e["event"] == "failed" and e.get("attempt") == attempt]
    if errors and not is_peer_error(errors):
        return errors[0].get("class") or CRASH
    return NODE_FAILURE


PEER_ERRORS = ("Connection closed", "Connection reset", "Broken pipe", "NCCL", "gloo",
               "Connection refused", "timed out", "Timeout", "peer", "ProcessGroup")


def is_peer_error(failed: list[dict[str, Any]]) -> bool:
    """Every recorded error is a communication error: the cause is elsewhere (a dead peer/node)."""
    return bool(failed) and all(any(k in str(e.get("error", "")) for k in PEER_ERRORS)
                                for e in failed)
