"""Stop signals: a handler only sets a flag; the loop agrees on it across ranks and all act together.

Why: saving from inside a handler (what submitit's `checkpoint()` does, on rank 0 only) cannot write
sharded ZeRO state. USR2 is Slurm's time-limit warning (--signal=USR2@lead); TERM is preemption or
scancel; INT (Ctrl-C on a local run) stops like TERM: save, then exit.
"""

from __future__ import annotations

import signal
import time
from types import FrameType
from typing import Optional

NONE, TIME_LIMIT, TERMINATE = 0, 1, 2


class SignalFlags:
    """USR2 (Slurm's time-limit warning, --signal=USR2@lead), TERM (preemption, scancel) and INT
    (Ctrl-C)."""

    def __init__(self) -> None:
        self.code = NONE
        self.received: Optional[str] = None
        self.received_at: Optional[float] = None

    def install(self) -> "SignalFlags":
        signal.signal(signal.SIGUSR2, self._handler)
        signal.signal(signal.SIGTERM, self._handler)
        signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum: int, _frame: Optional[FrameType]) -> None:
        code = TIME_LIMIT if signum == signal.SIGUSR2 else TERMINATE
        if code > self.code:
            self.code, self.received = code, signal.Signals(signum).name
            self.received_at = time.time()
