"""`python -m slurmtrain.cli sync RUN_DIR|NAME [--dry-run]`: upload a run's offline trackers.

Compute nodes seldom reach the internet, so W&B writes offline under RUN_DIR/wandb/: one
offline-run-* folder per attempt, all with the run's one id. From a login node `wandb sync` uploads
them; given every folder of the run it sends them in start order into ONE W&B run, and skips the
folders it uploaded before (so sync again after more attempts). MLflow's default is a file store
in RUN_DIR/mlruns: nothing to upload, this says where it is and how to look at it; with
logger.mlflow.tracking_uri set the ranks logged to that server already. No torch, no wandb import:
the upload is wandb's own command, in a child process.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import yaml

from slurmtrain.common.rundir import RunDir, runs_named


def offline_dirs(run: RunDir) -> list[Path]:
    """The run's W&B offline folders (one per attempt), oldest first."""
    return sorted(p for p in (run.path / "wandb").glob("offline-run-*") if p.is_dir())


def _logger(run: RunDir) -> dict[str, Any]:
    try:
        data = yaml.safe_load(run.config.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    return data.get("logger") or {}


def sync_wandb(run: RunDir, dry_run: bool) -> int:
    dirs = offline_dirs(run)
    if not dirs:
        print(f"sync: {run.path}: no offline W&B runs (wandb/offline-run-*)")
        return 0
    if importlib.util.find_spec("wandb") is None:
        print(
            "sync: the wandb package is not installed here; pip install 'slurmtrain[wandb]'",
            file=sys.stderr,
        )
        return 2
    command = [sys.executable, "-m", "wandb", "sync", *(["--dry-run"] if dry_run else [])]
    print(f"sync: {run.path}: {len(dirs)} offline W&B folder(s) -> one run")
    return subprocess.run([*command, *map(str, dirs)], check=False).returncode


def show_mlflow(run: RunDir, chosen: dict[str, Any]) -> None:
    uri = (chosen.get("mlflow") or {}).get("tracking_uri")
    store = run.path / "mlruns"
    if uri:
        print(f"sync: {run.path}: MLflow logged to {uri} from the compute nodes; nothing to do")
    elif store.is_dir():
        print(
            f"sync: {run.path}: MLflow file store {store} (nothing to upload); look at it with "
            f"MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {store.resolve().as_uri()}"
        )


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmtrain.cli sync", description=__doc__)
    parser.add_argument("run", help="a run directory, or a run name under --runs-root")
    parser.add_argument("--runs-root", default=None)
    parser.add_argument("--dry-run", action="store_true", help="say what would be uploaded")
    args = parser.parse_args(argv)
    found, root = runs_named(args.run, args.runs_root)
    if not found:
        print(
            f"sync: RUN_DIR={args.run!r}: no config.yaml there and no run of that name under "
            f"{root}; pass a run directory (runs/NAME/FINGERPRINT) or --runs-root",
            file=sys.stderr,
        )
        return 2
    rc = 0
    for run in found:
        chosen = _logger(run)
        if chosen.get("wandb") is not None or offline_dirs(run):
            rc = max(rc, sync_wandb(run, args.dry_run))
        show_mlflow(run, chosen)
    return rc
