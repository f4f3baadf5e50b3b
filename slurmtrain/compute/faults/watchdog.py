"""Hang watchdog: a thread per rank that ends a job which stopped making progress.

A rank stuck in a collective (a peer died, a deadlock, a stalled filesystem) raises nothing and
burns the allocation. Each phase of an attempt has its own deadline, scaled from the bytes it moves
(planning/deadlines.py); past it without a beat, every thread's stack goes to the node's
`<run>/hangs/attempt{A}.{node}.txt`, the hang is recorded naming the phase, and the process exits
with EXIT_HANG so the supervisor restarts the run.

The exit never waits on the filesystem, which is often what hangs: the dump and the record each
run in a daemon thread given `write_s` seconds, and `os._exit` follows regardless.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

from slurmtrain.compute.distributed import dump_collectives, follow_phase

WRITE_S = 10.0  # each filesystem write of the exit path (stacks, record) gets at most this


def bounded(fn: Callable[[], object], seconds: float, what: str) -> bool:
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
    """Write to stderr, waiting at most `wait_s`: slurmstepd may itself be stuck writing the log to
    the stalled filesystem, and then a full pipe blocks the writer."""

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
    """Every thread's stack, gathered in memory (faulthandler, blocked on a write while holding the
    GIL, would stop the thread that must call os._exit)."""
    import traceback

    out = io.StringIO()
    out.write(header)
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        out.write(f"\nThread {ident} ({names.get(ident, '?')}):\n")
        out.write("".join(traceback.format_stack(frame)))
    return out.getvalue()


class Watchdog:
    """Fires when the current phase goes `deadline_s` without a beat.

    `phase(name, deadline_s)` starts a phase with its own deadline, `beat(what)` starts it over,
    `during(name, deadline_s)` gives the previous phase back when it ends. A hang report names the
    phase, its deadline and the last beat.
    """

    def __init__(
        self,
        timeout_s: float,
        stacks: Path,
        on_hang: Callable[[str], None],
        exit_code: int,
        write_s: float = WRITE_S,
        phase: str = "starting",
        clock: Callable[[], float] = time.monotonic,
        rank: Optional[int] = None,
    ) -> None:
        """`rank`: the dump is one block of the node's shared file `stacks`; None: its own file."""
        self.stacks, self.on_hang, self.exit_code = stacks, on_hang, exit_code
        self.rank, self.dumped = rank, False
        self.write_s, self.clock = write_s, clock
        self.current, self.deadline_s = phase, float(timeout_s)
        self.last = clock()
        self.what = "starting"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="slurmtrain-watchdog", daemon=True)

    @property
    def timeout_s(self) -> float:  # the current phase's deadline
        return self.deadline_s

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def phase(self, name: str, deadline_s: float, what: Optional[str] = None) -> None:
        """Enter phase `name`: a new deadline, counted from now."""
        with self._lock:
            self.current, self.deadline_s = name, float(deadline_s)
            self.last, self.what = self.clock(), what or name
        # the collective timeout stays above this phase's deadline (distributed.py)
        follow_phase(name, deadline_s)

    @contextlib.contextmanager
    def during(self, name: str, deadline_s: float, what: Optional[str] = None) -> Iterator[None]:
        """Phase `name` for the `with` block; the phase before it resumes afterwards (its deadline
        counted from then)."""
        with self._lock:
            before = (self.current, self.deadline_s, self.what)
        self.phase(name, deadline_s, what)
        try:
            yield
        finally:
            self.phase(*before)

    def beat(self, what: Optional[str] = None) -> None:
        """Progress within the current phase: its deadline starts over."""
        with self._lock:
            self.last = self.clock()
            if what is not None:
                self.what = what

    def progress(self, phase: str, what: str) -> Callable[[int], None]:
        """A heartbeat for long IO (`fn(bytes so far)`), from any thread: it extends only `phase`,
        so a background writer never keeps a stalled step alive."""

        def beat(done: int) -> None:
            with self._lock:
                if self.current == phase:
                    self.last, self.what = self.clock(), f"{what} ({done:,} bytes)"

        return beat

    def stop(self) -> None:
        self._stop.set()

    def overdue(self) -> Optional[str]:
        """Why the watchdog must fire now, or None."""
        with self._lock:
            idle, current, deadline, what = (
                self.clock() - self.last,
                self.current,
                self.deadline_s,
                self.what,
            )
        if idle < deadline:
            return None
        return (
            f"no progress for {idle:.0f} s after {what} (phase {current}, deadline {deadline:g} s)"
        )

    def _watch(self) -> None:
        while not self._stop.wait(max(0.05, min(5.0, self.deadline_s / 4))):
            why = self.overdue()
            if why is not None and not self._stop.is_set():
                self.fire(why)

    def fire(self, why: str) -> None:
        """Dump stacks and record the hang, each within `write_s`, then exit: always."""
        try:
            text = stacks_text(f"{why}\n")
            say(text)  # srun's log too, never waited for
            bounded(lambda: self._dump(text), self.write_s, "stack dump")
            # NCCL's own dump never comes (the watchdog fires first): write the flight recorder
            bounded(dump_collectives, self.write_s, "collective trace")
            bounded(lambda: self.on_hang(why), self.write_s, "hang record")
        finally:
            os._exit(self.exit_code)

    def dump_after_peer_failure(self, header: str) -> None:
        """A peer failed first and this rank's collective failed: leave its stacks beside the hung
        one's, unless its own watchdog already wrote them."""
        if not self.dumped:
            text = stacks_text(header)
            bounded(lambda: self._dump(text), self.write_s, "stack dump")

    def _dump(self, text: str) -> None:
        self.dumped = True
        self.stacks.parent.mkdir(parents=True, exist_ok=True)
        if self.rank is None:
            with open(self.stacks, "w") as f:
                f.write(text)
            return
        # One write(2) with O_APPEND: whole among the node's ranks appending to the same file.
        data = f"==== rank {self.rank} ====\n{text.rstrip()}\n".encode()
        fd = os.open(self.stacks, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
