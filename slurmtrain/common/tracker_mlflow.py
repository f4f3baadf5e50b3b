"""MLflow: a file store in RUN_DIR/mlruns unless a tracking URI is named; one MLflow run per run.

Every attempt finds the run again by its tag `slurmtrain_run_id` (attempts as tags); `slurmtrain
sync --mlflow-uri URI` copies the file store's run to a server, only what is not there yet. mlflow
is imported only when the backend opens or sync copies (the `mlflow` extra: mlflow-skinny).
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from slurmtrain.common import events
from slurmtrain.common.events import Rows
from slurmtrain.common.tracked_rows import failure_class, flat, jsonl, outcome
from slurmtrain.common.tracker_registry import Context, SyncArgs, Tracker

RUN_TAG = "slurmtrain_run_id"  # the tag that finds the run again
MLFLOW_BATCH = 1000  # MLflow's log_batch takes at most 1000 metrics, 100 params


@dataclass
class MlflowLogger:
    # None: a file store in RUN_DIR/mlruns (no server); or the user's URI (http://, databricks...)
    tracking_uri: Optional[str] = None
    experiment: str = "slurmtrain"


def _client(uri: str) -> Any:
    if uri.startswith("file:"):
        # MLflow 3 keeps its file store "in maintenance" behind this switch; a run directory
        # on a shared filesystem is where a file store belongs (SQLite there is not safe).
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


class MlflowBackend:
    kind = "mlflow"

    def __init__(self, ctx: Context, c: MlflowLogger) -> None:
        self.client = client = _client(c.tracking_uri or (ctx.path / "mlruns").resolve().as_uri())
        from mlflow.entities import Metric, Param

        self.Metric, self.ctx = Metric, ctx
        experiment = client.get_experiment_by_name(c.experiment)
        exp_id = experiment.experiment_id if experiment else client.create_experiment(c.experiment)
        found = client.search_runs(
            [exp_id], filter_string=f"tags.{RUN_TAG} = '{ctx.run_id}'", max_results=1
        )
        if found:
            self.run_id = found[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
        else:
            tags = {RUN_TAG: ctx.run_id, "fingerprint": ctx.fingerprint, "run_dir": str(ctx.path)}
            self.run_id = client.create_run(exp_id, run_name=ctx.run_id, tags=tags).info.run_id
            # params are write-once in MLflow: the config as first submitted (config.yaml keeps
            # later versions; each attempt's is an artifact below)
            params = [Param(k, v[:6000]) for k, v in flat(ctx.config()).items()]
            for i in range(0, len(params), 100):
                client.log_batch(self.run_id, params=params[i : i + 100])
        started = ctx.started()
        n = ctx.attempt
        job_id = started.job_id if started is not None else None
        world = started.world_size if started is not None else None
        attempt_tags = {
            "attempt": str(n),
            f"attempt.{n}.job_id": "" if job_id is None else job_id,
            f"attempt.{n}.world_size": "" if world is None else str(world),
        }
        for key, value in attempt_tags.items():
            client.set_tag(self.run_id, key, value)
        client.log_dict(self.run_id, ctx.config(), f"config/attempt_{n}.yaml")
        client.log_dict(self.run_id, ctx.plan(), f"plan/attempt_{n}.json")
        client.log_dict(self.run_id, ctx.provenance(), f"provenance/attempt_{n}.json")

    def log(self, step: int, row: dict[str, float], fresh: Rows) -> None:
        stamp = int(time.time() * 1000)
        metrics = [self.Metric(k, float(v), stamp, step) for k, v in row.items()]
        for i in range(0, len(metrics), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + MLFLOW_BATCH])
        for e in fresh:
            cls = failure_class(e)
            if cls:  # the failure class of the newest failure, at a glance
                self.client.set_tag(self.run_id, f"last_{e.event}_class", cls)

    def close(self, step: int, kept: Rows, fresh: Rows) -> None:
        n = self.ctx.attempt
        self.client.log_text(self.run_id, jsonl(kept), f"events/attempt_{n}.jsonl")
        ended = outcome(kept)
        self.client.set_tag(self.run_id, f"attempt.{n}.outcome", ended)
        status = {events.Finished.kind: "FINISHED", events.Failed.kind: "FAILED"}.get(
            ended, "KILLED"
        )
        self.client.set_terminated(self.run_id, status=status)


def _copy_run(src: Any, dst: Any, r: Any, exp_id: str, uri: str) -> None:
    from mlflow.entities import Metric, Param

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
        for i in range(0, len(new), MLFLOW_BATCH):
            batch = [Metric(m.key, m.value, m.timestamp, m.step) for m in new[i : i + 1000]]
            dst.log_batch(run_id, metrics=batch)
        sent += len(new)
    artifacts = Path(r.info.artifact_uri.removeprefix("file://"))
    if artifacts.is_dir() and any(artifacts.iterdir()):
        dst.log_artifacts(run_id, str(artifacts))
    dst.set_terminated(run_id, status=r.info.status)
    print(f"sync: MLflow run {r.info.run_name} -> {uri} run {run_id} ({sent} new points)")


def copy_mlflow(run: Path, uri: str) -> int:
    """Copy the run's file-store MLflow run(s) to `uri`, found there again by RUN_TAG."""
    if importlib.util.find_spec("mlflow") is None:
        print(f"sync: the mlflow package is not installed here; {TRACKER.install_line()}")
        return 2
    src = _client((run / "mlruns").resolve().as_uri())  # reading our own file store
    dst = _client(uri)
    for exp in src.search_experiments():
        there = dst.get_experiment_by_name(exp.name)
        exp_id = there.experiment_id if there else dst.create_experiment(exp.name)
        for r in src.search_runs([exp.experiment_id]):
            _copy_run(src, dst, r, exp_id, uri)
    return 0


def sync(run: Path, section: Optional[Mapping[str, object]], args: SyncArgs) -> int:
    """Copy the file store to `--mlflow-uri`, or say where the run is."""
    store = run / "mlruns"
    if args.target and store.is_dir() and not args.dry_run:
        return copy_mlflow(run, args.target)
    uri = (section or {}).get("tracking_uri")
    if uri:
        print(f"sync: {run}: MLflow logged to {uri} from the compute nodes; nothing to do")
    elif store.is_dir():
        print(
            f"sync: {run}: MLflow file store {store} (nothing to upload); look at it with "
            f"MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {store.resolve().as_uri()}"
        )
    return 0


TRACKER = Tracker(
    name="mlflow",
    package="mlflow",
    extra="mlflow",
    section=MlflowLogger,
    open=MlflowBackend,
    sync=sync,
    offline="a file store in `mlruns/` (`logger.mlflow.tracking_uri=URI` logs to a server)",
    sync_says="prints the `mlflow ui` command; `--mlflow-uri URI` copies the run to a server",
    sync_flag=("--mlflow-uri", "copy the MLflow file store's run to this server"),
)
