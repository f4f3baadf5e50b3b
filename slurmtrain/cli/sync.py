"""`slurmtrain sync RUN [--dry-run] [--only NAME] [--mlflow-uri URI]`: a run's offline trackers up.

Compute nodes seldom reach the internet: each tracker (common/tracker_registry.py) says what its
offline files need: W&B's attempt folders under RUN_DIR/wandb/ go up through `wandb sync` into ONE
W&B run, skipping folders sent before; MLflow's file store RUN_DIR/mlruns is shown, or copied to a
server with `--mlflow-uri` (only what is not there yet); Aim's repository RUN_DIR/aim is shown. The
tracker packages are imported only when needed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Mapping, Optional

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from slurmtrain.cli import run_arg
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.tracker_registry import SyncArgs, Tracker, trackers


def _logger(run: RunDir) -> dict[str, Optional[Mapping[str, object]]]:
    """The run's config.yaml `logger` section (tracker name -> its section, None: not chosen)."""
    try:
        data = yaml.safe_load(run.config.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    section = data.get("logger") or {}
    return section if isinstance(section, dict) else {}


def _flag(t: Tracker) -> Optional[str]:
    return t.sync_flag[0].lstrip("-").replace("-", "_") if t.sync_flag else None


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="slurmtrain sync",
        description=__doc__,
        epilog="example: slurmtrain sync lr_sweep --dry-run   (a name: every run of it)\n"
        "         slurmtrain sync runs/demo/3f2a9c1e77b0 --mlflow-uri http://mlflow:5000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", metavar="RUN", help=run_arg.HELP)
    parser.add_argument("--runs-root", default=None, help="where run names are looked up")
    parser.add_argument("--dry-run", action="store_true", help="say what would be uploaded")
    for t in trackers():
        if t.sync_flag:
            parser.add_argument(t.sync_flag[0], help=t.sync_flag[1])
    names = [t.name for t in trackers()]
    parser.add_argument("--only", choices=names, help="sync one tracker only")
    args = parser.parse_args(argv)
    paths, root = run_arg.resolve(args.run, args.runs_root)
    found = [RunDir(p) for p in paths]
    if not found:
        print(f"sync: {run_arg.not_found(args.run, root)}", file=sys.stderr)
        return 2
    rc = 0
    for run in found:
        chosen = _logger(run)
        if not any(chosen.get(t.name) for t in trackers()):  # it used to say nothing, exit 0
            kinds = ", ".join(t.name for t in trackers())
            print(
                f"sync: {run.path} logs to no tracker (logger= none of {kinds}): nothing to upload"
            )
            continue
        for t in trackers():
            if args.only not in (None, t.name):
                continue
            flag = _flag(t)
            target = getattr(args, flag) if flag else None
            rc = max(rc, t.sync(run.path, chosen.get(t.name), SyncArgs(args.dry_run, target)))
    return rc
