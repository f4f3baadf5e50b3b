"""Aim: a local repository in RUN_DIR/aim (offline by nature), one Aim run for every attempt.

The first attempt creates the run and stores its hash in RUN_DIR/aim/slurmtrain_run_hash-<run id>;
every later attempt (requeue, restart) resumes that run (force_resume: a killed attempt leaves its
lock behind). `aim up --repo RUN_DIR/aim` shows it; nothing to upload. aim is imported only when
the backend opens (the `aim` extra).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from slurmtrain.common.events import Rows
from slurmtrain.common.tracked_rows import event_row, outcome
from slurmtrain.common.tracker_registry import Context, SyncArgs, Tracker

HASH_FILE = "slurmtrain_run_hash"


@dataclass
class AimLogger:
    experiment: str = "slurmtrain"
    repo: Optional[str] = None  # None: RUN_DIR/aim; or a shared Aim repository's directory


def repo_dir(run: Path, c: Optional[AimLogger] = None) -> Path:
    return Path(c.repo) if c is not None and c.repo else run / "aim"


def _resume(repo: Path, stored: Path, experiment: str) -> Any:
    """The Aim run whose hash `stored` holds, or a new one (its hash then stored)."""
    from aim import Run
    from aim.sdk.errors import MissingRunError

    quiet = {"system_tracking_interval": None, "capture_terminal_logs": False}
    known = stored.read_text().strip() if stored.is_file() else ""
    if known:
        try:
            return Run(run_hash=known, repo=str(repo), force_resume=True, **quiet)
        except MissingRunError:
            pass  # a repository removed by hand: a new run
    run = Run(repo=str(repo), experiment=experiment, log_system_params=False, **quiet)
    tmp = stored.with_name(stored.name + ".tmp")
    tmp.write_text(run.hash + "\n")
    os.replace(tmp, stored)
    return run


class AimBackend:
    kind = "aim"

    def __init__(self, ctx: Context, c: AimLogger) -> None:
        repo = repo_dir(ctx.path, c)
        repo.mkdir(parents=True, exist_ok=True)
        self.ctx = ctx
        self.run = _resume(repo, repo / f"{HASH_FILE}-{ctx.run_id}", c.experiment)
        if self.run.get("slurmtrain_run_id") is None:
            self.run["slurmtrain_run_id"] = ctx.run_id
            self.run["fingerprint"] = ctx.fingerprint
            self.run["config"] = ctx.config()
            self.run["plan"] = ctx.plan()
        started = ctx.started()
        n = ctx.attempt
        self.run["attempt"] = n
        self.run[f"attempt_{n}"] = {
            "provenance": ctx.provenance(),
            "job_id": started.job_id if started is not None else None,
            "world_size": started.world_size if started is not None else None,
        }

    def log(self, step: int, row: dict[str, float], fresh: Rows) -> None:
        for key, value in row.items():
            self.run.track(float(value), name=key, step=step)

    def close(self, step: int, kept: Rows, fresh: Rows) -> None:
        n = self.ctx.attempt
        self.run[f"attempt_{n}_events"] = [event_row(e) for e in kept]
        self.run[f"attempt_{n}_outcome"] = outcome(kept)
        self.run.close()


def sync(run: Path, section: Optional[Mapping[str, object]], args: SyncArgs) -> int:
    """Nothing to upload: say where the repository is and how to look at it."""
    shared = (section or {}).get("repo")
    repo = Path(str(shared)) if shared else run / "aim"
    if section is not None or (run / "aim").is_dir():
        print(f"sync: {run}: Aim repository {repo} (nothing to upload); aim up --repo {repo}")
    return 0


TRACKER = Tracker(
    name="aim",
    package="aim",
    extra="aim",
    section=AimLogger,
    open=AimBackend,
    sync=sync,
    offline="a local Aim repository in `aim/` (`logger.aim.repo=DIR` for a shared one)",
    sync_says="prints the `aim up` command (nothing to upload)",
)
