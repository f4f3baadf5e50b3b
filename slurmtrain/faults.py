"""Signals, failure classes and the collective stop protocol's rank-local half.

A handler only sets a flag: saving from inside a signal handler (what submitit's `checkpoint()` does,
on rank 0 only) cannot write sharded ZeRO state. The loop agrees on the flags across ranks at each step
boundary and then all ranks act together.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Optional

NONE, TIME_LIMIT, TERMINATE = 0, 1, 2
PREEMPTED, TIMED_OUT, NODE_FAILURE, HANG, CRASH, CONFIG_ERROR = (
    "preempted", "timed_out", "node_failure", "hang", "crash", "config_error")
FAILURE_CLASSES = (PREEMPTED, TIMED_OUT, NODE_FAILURE, HANG, CRASH, CONFIG_ERROR)
# Exit code asking the batch shell to requeue (inside a container without scontrol).
EXIT_REQUEUE = 3


class SignalFlags:
    """USR2 (Slurm's time-limit warning, --signal=USR2@lead) and TERM (preemption, scancel)."""

    def __init__(self) -> None:
        self.code = NONE
        self.received: Optional[str] = None

    def install(self) -> "SignalFlags":
        signal.signal(signal.SIGUSR2, self._handler)
        signal.signal(signal.SIGTERM, self._handler)
        return self

    def _handler(self, signum: int, _frame: Optional[FrameType]) -> None:
        code = TIME_LIMIT if signum == signal.SIGUSR2 else TERMINATE
        self.code = max(self.code, code)
        self.received = signal.Signals(signum).name
