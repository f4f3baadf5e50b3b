"""Hang watchdog: a thread per rank that ends a job which stopped making progress.

A rank stuck in a collective (a peer died, a deadlock, a stalled filesystem) makes no error of its
own and burns the allocation until the time limit. Past `hang_timeout_s` without a beat, every
thread's stack goes to `<run>/hangs/attempt{A}.rank{R}.txt`, the hang is recorded, and the process
exits with EXIT_HANG so the supervisor restarts the run (class: hang).
"""

from __future__ import annotations

import faulthandler
import os
import threading
import time
from pathlib import Path
from typing import Callable


class Watchdog:
    def __init__(
        self, timeout_s: float, stacks: Path, on_hang: Callable[[str], None], exit_code: int
    ) -> None:
        self.timeout_s, self.stacks, self.on_hang, self.exit_code = (
            timeout_s,
            stacks,
            on_hang,
            exit_code,
        )
        self.last = time.monotonic()
        self.what = "starting"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="slurmtrain-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def beat(self, what: str) -> None:
        self.last, self.what = time.monotonic(), what

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(5.0, self.timeout_s / 4)):
            idle = time.monotonic() - self.last
            if idle < self.timeout_s:
                continue
            self.stacks.parent.mkdir(parents=True, exist_ok=True)
            with open(self.stacks, "w") as f:
                f.write(f"no progress for {idle:.0f} s (last: {self.what})\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
            try:
                self.on_hang(f"no progress for {idle:.0f} s after {self.what}")
            finally:
                os._exit(self.exit_code)
