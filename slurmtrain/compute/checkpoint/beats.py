"""Checkpoint IO under the watchdog: saves and loads run in their own phase, and beat it.

A save or load is long IO with no training step: its phase (`save`, `startup:load`, or `load` in a
rollback) has a deadline scaled by the bytes this rank moves (planning/deadlines.py), beaten per
chunk or shard written and per file DeepSpeed reads. Without a watchdog everything here is a no-op.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from typing import TYPE_CHECKING, Callable, Iterator, Optional, TypedDict

from slurmtrain.compute.faults.watchdog import Watchdog
from slurmtrain.planning.deadlines import LOAD, SAVE, Deadlines

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

Hook = Callable[[int, str], None]
Progress = Callable[[int], None]


class WriterKwargs(TypedDict, total=False):
    progress: Progress  # the shard writer's per-chunk heartbeat


class Beats:
    def __init__(self, watchdog: Optional[Watchdog], deadlines: Optional[Deadlines]) -> None:
        self.watchdog, self.deadlines = watchdog, deadlines
        self.on = watchdog is not None and deadlines is not None

    def writer_kwargs(self, engine_class: type) -> WriterKwargs:
        """`progress=` for the shard writer's engine: a heartbeat per chunk written, when its
        constructor takes one (checked on its signature, so either version of writer.py works)."""
        if self.watchdog is None or not self.on:
            return {}
        if "progress" not in inspect.signature(engine_class).parameters:
            return {}
        return {"progress": self.watchdog.progress(SAVE, "writing shards")}

    def hook(self, hook: Optional[Hook]) -> Optional[Hook]:
        """The writer's per-shard hook, beating the save phase before `hook` (any writer)."""
        if self.watchdog is None or not self.on:
            return hook
        beat = self.watchdog.progress(SAVE, "writing shards")

        def after_shard(step: int, name: str) -> None:
            beat(0)
            if hook is not None:
                hook(step, name)

        return after_shard

    @contextlib.contextmanager
    def phase(self, name: str, seconds: Callable[[Deadlines], float]) -> Iterator[None]:
        """The watchdog's phase `name` for the block; the phase before it resumes afterwards."""
        if self.watchdog is None or self.deadlines is None:
            yield
            return
        with self.watchdog.during(name, seconds(self.deadlines)):
            yield

    def load_phase(self) -> str:
        """`startup:load` while starting, `load` in a rollback."""
        if (
            self.watchdog is not None
            and self.on
            and not str(self.watchdog.current).startswith("startup")
        ):
            return "load"
        return LOAD

    @contextlib.contextmanager
    def loading(self, engine: DeepSpeedEngine, phase: str) -> Iterator[None]:
        """DeepSpeed reads every file through `engine.checkpoint_engine.load`: beat per file."""
        from slurmtrain.compute import deepspeed_compat

        ce = engine.checkpoint_engine
        if self.watchdog is None or not self.on or not hasattr(ce, "load"):
            yield
            return
        beat = self.watchdog.progress(phase, "loading")
        with deepspeed_compat.each_file_read(ce, lambda path: beat(0), lambda p: beat(_size(p))):
            yield


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
