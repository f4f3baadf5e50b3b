"""Counts what one rank's start-up costs the shared tier, for bench/restart_ops.py: off unless
SLURMTRAIN_COUNT_IO=1, then from the process's first line to its first optimizer step.

Counted, for paths under the run directory (the shared filesystem in production):
  files_read / files_written  open() calls (the audit hook's `open` event: builtins, io, os.open)
  bytes_read                  the size of each file opened for reading (an upper bound: the readers
                              here read what they open in full)
  metadata                    stat/lstat (os.stat: pathlib's exists/stat/is_dir go through it),
                              listdir, scandir, glob
  collectives                 torch.distributed calls (each one a rendezvous round trip of all ranks)
  env_files                   files opened outside the run directory (imports, the corpus): per
                              rank and flat in node count, listed to show where modules came from
  env_staged                  those of them in the node-local copy of the environment
                              (cluster.stage_env: SLURMTRAIN_STAGED_ENV), not the shared one
At the first step each rank writes its counts, with the shared-tier paths it read and how often, to
RUN/io_count/<job>.<restart>.<relaunch>/rank<N>.json (after counting stops: not counted).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from slurmtrain.common.slurm_text import attempt_counters

if TYPE_CHECKING:
    from slurmtrain.compute.distributed import Placement

ENV = "SLURMTRAIN_COUNT_IO"
COLLECTIVES = (
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "all_gather_object",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "gather_object",
    "scatter_object_list",
    "reduce_scatter_tensor",
    "monitored_barrier",
)


class Counts:
    """One process's counters; `root` is the shared tier (the run directory)."""

    def __init__(self, root: Path) -> None:
        self.root = str(root.resolve())
        self.active = True
        self.ops: Counter[str] = Counter()
        self.read_paths: Counter[str] = Counter()
        self.stat_paths: Counter[str] = Counter()
        self.env_dirs: Counter[str] = Counter()
        self.staged = os.environ.get("SLURMTRAIN_STAGED_ENV", "")  # cluster.stage_env's copy
        self._stat = os.stat  # the real one: bytes_read's size look-up is not itself counted

    def shared(self, path: object) -> Optional[str]:
        """`path` relative to the run directory, or None when it lies outside (or is an fd)."""
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, (str, os.PathLike)):
            return None
        full = os.path.abspath(os.fspath(path))
        if full == self.root or full.startswith(self.root + os.sep):
            return os.path.relpath(full, self.root)
        return None

    def on_open(self, path: object, mode: object, flags: object) -> None:
        rel = self.shared(path)
        if rel is None:
            if isinstance(path, (str, bytes, os.PathLike)):
                name = os.fsdecode(os.fspath(path))
                self.ops["env_files"] += 1
                self.ops["env_staged"] += bool(self.staged) and name.startswith(self.staged)
                self.env_dirs[_top(name)] += 1
            return
        writing = _writes(mode, flags)
        self.ops["files_written" if writing else "files_read"] += 1
        if not writing:
            self.read_paths[_shape(rel)] += 1
            try:
                self.ops["bytes_read"] += self._stat(os.path.join(self.root, rel)).st_size
            except OSError:
                pass

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        """The audit hook: opens and directory listings (stat has no audit event: wrapped)."""
        if not self.active:
            return
        if event == "open" and args:
            self.on_open(
                args[0], args[1] if len(args) > 1 else "r", args[2] if len(args) > 2 else 0
            )
        elif event in ("os.listdir", "os.scandir", "glob.glob") and args:
            rel = self.shared(args[0] if args[0] is not None else ".")
            if rel is not None:
                self.ops["metadata"] += 1
                self.stat_paths[_shape(rel)] += 1

    def counting(self, real: Callable[..., Any], kind: str) -> Callable[..., Any]:
        """`real` (os.stat, a collective), counting its calls while active."""

        def counted(*args: Any, **kwargs: Any) -> Any:
            rel = None if kind == "collectives" or not args else self.shared(args[0])
            if self.active and (kind == "collectives" or rel is not None):
                self.ops[kind] += 1
                if rel is not None:
                    self.stat_paths[_shape(rel)] += 1
            return real(*args, **kwargs)

        return counted

    def report(self, rank: int, node: str) -> dict[str, Any]:
        return {
            "rank": rank,
            "node": node,
            **{k: self.ops.get(k, 0) for k in OPS},
            "env_files": self.ops.get("env_files", 0),
            "env_staged": self.ops.get("env_staged", 0),
            "read_paths": dict(sorted(self.read_paths.items())),
            "stat_paths": dict(sorted(self.stat_paths.items())),
            "env_dirs": dict(self.env_dirs.most_common(4)),
        }


OPS = ("files_read", "metadata", "collectives", "bytes_read", "files_written")
_counts: Optional[Counts] = None


def install(run_path: Path) -> None:
    """SLURMTRAIN_COUNT_IO=1: count from here on (attempt.run's first line)."""
    global _counts
    if os.environ.get(ENV) != "1" or _counts is not None:
        return
    _counts = Counts(run_path)
    sys.addaudithook(_counts.hook)
    os.stat = _counts.counting(os.stat, "metadata")
    os.lstat = _counts.counting(os.lstat, "metadata")


def count_collectives() -> None:
    """After torch.distributed is imported: its collectives counted (callers use dist.X)."""
    if _counts is None:
        return
    import torch.distributed as dist

    for name in COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, _counts.counting(getattr(dist, name), "collectives"))


def first_step(where: Placement) -> None:
    """At the first optimizer step: counting stops, this rank's counts written (once)."""
    if _counts is None or not _counts.active:
        return
    _counts.active = False
    restart, relaunch = attempt_counters(os.environ)
    out = Path(_counts.root) / "io_count" / f"{where.job_id}.{restart}.{relaunch}"
    out.mkdir(parents=True, exist_ok=True)
    report = json.dumps(_counts.report(where.rank, where.node))
    (out / f"rank{where.rank}.json").write_text(report + "\n")


def _writes(mode: object, flags: object) -> bool:
    if isinstance(mode, str) and mode:
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))


def _shape(rel: str) -> str:
    """A path with digits folded (step_000004 -> step_#), so one kind of file is one key."""
    import re

    return re.sub(r"\d+", "#", rel)


def _top(path: str) -> str:
    """The directory a non-shared file came from, to its site-packages or top three parts."""
    parts = Path(path).parts
    if "site-packages" in parts:
        return os.path.join(*parts[: parts.index("site-packages") + 1])
    return os.path.join(*parts[:4]) if len(parts) > 1 else path
