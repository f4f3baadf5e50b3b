"""`slurmtrain sync RUN [--dry-run] [--mlflow-uri URI]`: upload a run's offline trackers.

Compute nodes seldom reach the internet: W&B writes one offline folder per attempt under
RUN_DIR/wandb/, which `wandb sync` (in a child process) uploads in start order into ONE W&B run,
skipping folders sent before. MLflow's file store RUN_DIR/mlruns is shown, or copied to a server
with `--mlflow-uri` (only what is not there yet). wandb/mlflow are imported only when needed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, TypedDict

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from slurmtrain.cli import run_arg
from slurmtrain.common.rundir import RunDir


def offline_dirs(run: RunDir) -> list[Path]:
    """The run's W&B offline folders (one per attempt), oldest first."""
    return sorted(p for p in (run.path / "wandb").glob("offline-run-*") if p.is_dir())


class MlflowKeys(TypedDict, total=False):
    tracking_uri: Optional[str]


class LoggerKeys(TypedDict, total=False):
    """The run's config.yaml `logger` section, as far as sync reads it."""

    wandb: Optional[dict[str, object]]
    mlflow: Optional[MlflowKeys]


def _logger(run: RunDir) -> LoggerKeys:
    try:
        data = yaml.safe_load(run.config.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    section: LoggerKeys = data.get("logger") or LoggerKeys()
    return section


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


def show_mlflow(run: RunDir, chosen: LoggerKeys) -> None:
    uri = (chosen.get("mlflow") or MlflowKeys()).get("tracking_uri")
    store = run.path / "mlruns"
    if uri:
        print(f"sync: {run.path}: MLflow logged to {uri} from the compute nodes; nothing to do")
    elif store.is_dir():
        print(
            f"sync: {run.path}: MLflow file store {store} (nothing to upload); look at it with "
            f"MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {store.resolve().as_uri()}"
        )


RUN_TAG = "slurmtrain_run_id"  # compute/observe/tracker_backends.py: the tag that finds a run


def copy_mlflow(run: RunDir, uri: str) -> int:
    """Copy the run's file-store MLflow run(s) to `uri`, found there again by RUN_TAG."""
    if importlib.util.find_spec("mlflow") is None:
        print("sync: the mlflow package is not installed here; pip install 'slurmtrain[mlflow]'")
        return 2
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # reading our own file store
    from mlflow.entities import Metric, Param  # optional dependency, checked above
    from mlflow.tracking import MlflowClient

    src = MlflowClient(tracking_uri=(run.path / "mlruns").resolve().as_uri())
    dst = MlflowClient(tracking_uri=uri)
    for exp in src.search_experiments():
        there = dst.get_experiment_by_name(exp.name)
        exp_id = there.experiment_id if there else dst.create_experiment(exp.name)
        for r in src.search_runs([exp.experiment_id]):
            tag = r.data.tags.get(RUN_TAG, r.info.run_id)
            found = dst.search_runs([exp_id], f"tags.{RUN_TAG} = '{tag}'", max_results=1)
            if found:
                run_id = found[0].info.run_id
            else:
                run_id = dst.create_run(exp_id, run_name=r.info.run_name).info.run_id
                params = [Param(k, v) for k, v in r.data.params.items()]
                for i in range(0, len(params), 100):
                    dst.log_batch(run_id, params=params[i : i + 100])
            for key, value in {**r.data.tags, RUN_TAG: tag}.items():
                if not key.startswith("mlflow."):
                    dst.set_tag(run_id, key, value)
            sent = 0
            for key in r.data.metrics:
                last = max((m.step for m in dst.get_metric_history(run_id, key)), default=0)
                new = [m for m in src.get_metric_history(r.info.run_id, key) if m.step > last]
                for i in range(0, len(new), 1000):
                    batch = [Metric(m.key, m.value, m.timestamp, m.step) for m in new[i : i + 1000]]
                    dst.log_batch(run_id, metrics=batch)
                sent += len(new)
            artifacts = Path(r.info.artifact_uri.removeprefix("file://"))
            if artifacts.is_dir() and any(artifacts.iterdir()):
                dst.log_artifacts(run_id, str(artifacts))
            dst.set_terminated(run_id, status=r.info.status)
            print(f"sync: MLflow run {r.info.run_name} -> {uri} run {run_id} ({sent} new points)")
    return 0


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
    parser.add_argument("--mlflow-uri", help="copy the MLflow file store's run to this server")
    parser.add_argument("--only", choices=("wandb", "mlflow"), help="sync one tracker only")
    args = parser.parse_args(argv)
    paths, root = run_arg.resolve(args.run, args.runs_root)
    found = [RunDir(p) for p in paths]
    if not found:
        print(f"sync: {run_arg.not_found(args.run, root)}", file=sys.stderr)
        return 2
    rc = 0
    for run in found:
        chosen = _logger(run)
        if args.only != "mlflow" and (chosen.get("wandb") is not None or offline_dirs(run)):
            rc = max(rc, sync_wandb(run, args.dry_run))
        if args.only == "wandb":
            continue
        if args.mlflow_uri and (run.path / "mlruns").is_dir() and not args.dry_run:
            rc = max(rc, copy_mlflow(run, args.mlflow_uri))
        else:
            show_mlflow(run, chosen)
    return rc
