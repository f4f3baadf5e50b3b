"""Weights & Biases: offline under RUN_DIR/wandb/ by default, one W&B run for every attempt.

Every attempt opens the run's id with resume="allow", so `wandb sync` (`slurmtrain sync`) uploads
the attempts' offline folders into ONE run. wandb is imported only when the backend opens or sync
runs (the `wandb` extra).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from slurmtrain.common import events
from slurmtrain.common.events import Rows
from slurmtrain.common.schema_cluster import StrEnum
from slurmtrain.common.tracked_rows import event_row, jsonl, outcome
from slurmtrain.common.tracker_registry import Context, SyncArgs, Tracker


class WandbMode(StrEnum):
    # Compute nodes seldom reach the internet: offline writes under RUN_DIR/wandb/, uploaded by
    # `python -m slurmtrain.cli sync RUN_DIR`.
    offline = "offline"
    online = "online"
    disabled = "disabled"


@dataclass
class WandbLogger:
    mode: WandbMode = WandbMode.offline
    project: str = "slurmtrain"
    entity: Optional[str] = None
    id: Optional[str] = None  # None: <name>-<fingerprint>, one W&B run for every attempt
    tags: list[str] = field(default_factory=list)


class WandbBackend:
    kind = "wandb"

    def __init__(self, ctx: Context, c: WandbLogger) -> None:
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self.ctx = ctx
        self.run = wandb.init(
            project=c.project,
            entity=c.entity,
            id=c.id or ctx.run_id,
            resume="allow",
            mode=c.mode,  # type: ignore[arg-type]  # wandb's Literal; the schema's choices
            dir=str(ctx.path),  # RUN_DIR/wandb/
            name=ctx.run_id,
            tags=list(c.tags) or None,
            config={"config": ctx.config(), "plan": ctx.plan()},
            # Slurm keeps the logs; provenance/ keeps the git state, redacted (a remote URL may
            # carry a token, which W&B's own git capture would record)
            settings=wandb.Settings(console="off", save_code=False, disable_git=True),
        )
        self.run.config.update(
            {"provenance": ctx.provenance(), "attempt": ctx.attempt}, allow_val_change=True
        )
        self.run.summary.update({"attempt": ctx.attempt, "fingerprint": ctx.fingerprint})

    def log(self, step: int, row: dict[str, float], fresh: Rows) -> None:
        if fresh:
            self.run.summary.update({f"last/{e.event}": event_row(e) for e in fresh})
        self.run.log(row, step=step)

    def close(self, step: int, kept: Rows, fresh: Rows) -> None:
        if fresh:
            self.run.summary.update({f"last/{e.event}": event_row(e) for e in fresh})
        # the attempt's events beside the run's files (uploaded by `wandb sync`)
        name = Path(self.run.dir) / f"events_attempt_{self.ctx.attempt}.jsonl"
        name.write_text(jsonl(kept))
        self.run.finish(exit_code=0 if outcome(kept) != events.Failed.kind else 1)


def offline_dirs(run: Path) -> list[Path]:
    """The run's W&B offline folders (one per attempt), oldest first."""
    return sorted(p for p in (run / "wandb").glob("offline-run-*") if p.is_dir())


def sync(run: Path, section: Optional[Mapping[str, object]], args: SyncArgs) -> int:
    """`wandb sync` (a child process) on the attempts' folders, in start order, into one run."""
    dirs = offline_dirs(run)
    if section is None and not dirs:
        return 0
    if not dirs:
        print(f"sync: {run}: no offline W&B runs (wandb/offline-run-*)")
        return 0
    if importlib.util.find_spec("wandb") is None:
        print(
            f"sync: the wandb package is not installed here; {TRACKER.install_line()}",
            file=sys.stderr,
        )
        return 2
    command = [sys.executable, "-m", "wandb", "sync", *(["--dry-run"] if args.dry_run else [])]
    print(f"sync: {run}: {len(dirs)} offline W&B folder(s) -> one run")
    return subprocess.run([*command, *map(str, dirs)], check=False).returncode


TRACKER = Tracker(
    name="wandb",
    package="wandb",
    extra="wandb",
    section=WandbLogger,
    open=WandbBackend,
    sync=sync,
    offline="`wandb/offline-run-*`, one folder per attempt (`logger.wandb.mode=offline`)",
    sync_says="`wandb sync` uploads the attempts into one W&B run",
)
