"""Hang watchdog: a thread per rank that ends a job which stopped making progress.

A rank stuck in a collective (a peer died, a deadlock, a stalled filesystem) makes no error of its
own and burns the allocation until the time limit. Past `hang_timeout_s` without a beat, every
thread's stack goes to `<run>/hangs/attempt{A}.rank{R}.txt`, the hang is recorded, and the process
exits with EXIT_HANG so the supervisor restarts the run (class: hang).

The exit never waits on the filesystem: a hang is often the filesystem itself (an NFS server that
stopped answering), and a watchdog that blocks in `open()` or `write()` would hang with the rank it
guards. The stack dump and the `failed` record each run in a daemon thread given `write_s` seconds;
one that has not finished by then is abandoned, and `os._exit` follows regardless.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

WRITE_S = 10.0  # each filesystem write of the exit path (stacks, record) gets at most this


def bounded(fn: Callable[[], None], seconds: float, what: str) -> bool:
    """Run `fn` in a daemon thread; True if it finished within `seconds` (else it is abandoned:
    the process is about to `os._exit`, which ends the thread wherever it is blocked)."""
    done = threading.Event()

    def call() -> None:
        try:
            fn()
        except BaseException as err:  # noqa: BLE001  the exit path must go on whatever happens
            say(f"slurmtrain: watchdog: {what} failed: {err}")
        finally:
            done.set()

    threading.Thread(target=call, name=f"slurmtrain-watchdog-{what}", daemon=True).start()
    if done.wait(seconds):
        return True
    say(f"slurmtrain: watchdog: {what} gave up after {seconds:g} s")
    return False


def say(text: str, wait_s: float = 0.5) -> None:
    """Write to stderr, waiting at most `wait_s`: stderr is a pipe to slurmstepd, which may itself
    be stuck writing the log to the stalled filesystem (then a full pipe blocks the writer)."""

    def write() -> None:
        try:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass

    thread = threading.Thread(target=write, name="slurmtrain-watchdog-say", daemon=True)
    thread.start()
    thread.join(wait_s)


def stacks_text(header: str) -> str:
    """Every thread's stack, gathered in memory (faulthandler writes to a file descriptor while
    holding the GIL: blocked there, it would stop the thread that must call os._exit)."""
    import traceback

    out = io.StringIO()
    out.write(header)
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        out.write(f"\nThread {ident} ({names.get(ident, '?')}):\n")
        out.write("".join(traceback.format_stack(frame)))
    return out.getvalue()


class Watchdog:
    def __init__(
        self,
        timeout_s: float,
        stacks: Path,
        on_hang: Callable[[str], None],
        exit_code: int,
        write_s: float = WRITE_S,
    ) -> None:
        self.timeout_s, self.stacks, self.on_hang, self.exit_code = (
            timeout_s,
            stacks,
            on_hang,
            exit_code,
        )
        self.write_s = write_s
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
            if idle >= self.timeout_s:
                self.fire(f"no progress for {idle:.0f} s after {self.what}")

    def fire(self, why: str) -> None:
        """Dump stacks and record the hang, each within `write_s`, then exit: always."""
        try:
            text = stacks_text(f"{why}\n")
            say(text)  # srun's log too, never waited for
            bounded(lambda: self._dump(text), self.write_s, "stack dump")
            bounded(lambda: self.on_hang(why), self.write_s, "hang record")
        finally:
            os._exit(self.exit_code)

    def _dump(self, text: str) -> None:
        self.stacks.parent.mkdir(parents=True, exist_ok=True)
        with open(self.stacks, "w") as f:
            f.write(text)
