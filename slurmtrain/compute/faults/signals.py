"""Stop signals: a handler only sets a flag; the loop agrees on it across ranks and all act together.

Why: saving from inside a handler (what submitit's `checkpoint()` does, on rank 0 only) cannot write
sharded ZeRO state. USR2 is Slurm's time-limit warning (--signal=USR2@lead); TERM is preemption or
scancel; INT (Ctrl-C on a local run) stops like TERM: save, then exit. Rank 0 also asks for a stop
of its own (REPLACE_NODE: a chronic straggler while the allocation holds a spare node): the ranks
agree on it the same way, save, and exit EXIT_BAD_NODE, so the supervisor restarts inside the
allocation on the spare. A signal outranks it (the codes' order: the ranks agree on the maximum).
"""

from __future__ import annotations

import signal
import time
from types import FrameType
from typing import Optional

from slurmtrain.common.errors import EXIT_BAD_NODE, EXIT_REQUEUE, EXIT_TERMINATED

NONE, REPLACE_NODE, TIME_LIMIT, TERMINATE = 0, 1, 2, 3
# What the attempt exits with after the ranks stopped on each code (the supervisor reads it).
EXIT_CODES = {REPLACE_NODE: EXIT_BAD_NODE, TIME_LIMIT: EXIT_REQUEUE, TERMINATE: EXIT_TERMINATED}


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

    def replace_node(self) -> None:
        """Rank 0: stop at the next step boundary (saved) so a spare takes a chronic straggler's
        place; a signal already received stays the stronger code."""
        if self.code == NONE:
            self.code = REPLACE_NODE
