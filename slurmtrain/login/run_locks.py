"""Taking the run directories' locks before their state is checked: one, or a sweep's side by side.

Each lock is a flock and a lease file created beside it (common/runlock.py). A sweep's points
take theirs on a few threads so that the file creations overlap; if any is busy (another shell is
submitting one of the points) all are let go and taken again one after the other, in point
order, waiting as long as a single submission waits: two overlapping sweeps never hold each
other's locks while each waits for the rest.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from typing import Sequence

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.rundir import RunDir, RunLocked

WORKERS = 16


def take(runs: Sequence[RunDir], runs_root: str, locks: ExitStack) -> None:
    """Hold every run's lock in `locks` (released when the caller's stack closes)."""
    if len(runs) > 1:
        side_by_side = ExitStack()
        with ThreadPoolExecutor(max_workers=min(WORKERS, len(runs))) as pool:
            futures = [pool.submit(_entered, run.locked(timeout=0.0)) for run in runs]
        failed: list[tuple[RunDir, BaseException]] = []
        for run, future in zip(runs, futures):  # every lock taken is held here, or let go
            error = future.exception()
            if error is None:
                side_by_side.push(future.result())
            else:
                failed.append((run, error))
        if not failed:
            locks.enter_context(side_by_side)
            return
        side_by_side.close()
        run, error = next((f for f in failed if not isinstance(f[1], RunLocked)), failed[0])
        if isinstance(error, OSError):
            raise _unwritable(runs_root, run, error) from None
        if not isinstance(error, RunLocked):
            raise error
    for run in runs:  # one after the other, in order, each waiting its full timeout
        try:
            locks.enter_context(run.locked())  # the first thing made under runs_root
        except OSError as err:
            raise _unwritable(runs_root, run, err) from None


def _entered(lock: AbstractContextManager[None]) -> AbstractContextManager[None]:
    lock.__enter__()
    return lock


def _unwritable(runs_root: str, run: RunDir, err: OSError) -> ConfigError:
    return ConfigError(
        f"runs_root={runs_root!r}: cannot create {run.path} ({err.strerror}); "
        f"use a directory you can write, e.g. runs_root=$HOME/slurmtrain-runs"
    )
