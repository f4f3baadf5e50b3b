"""The W&B and MLflow ends of compute/observe/trackers.py, through the libraries themselves.

W&B: offline by default under RUN_DIR/wandb/, every attempt with the run's id and resume="allow",
so `wandb sync` uploads them into ONE run. MLflow: a file store in RUN_DIR/mlruns unless a tracking
URI is named; the run is found again by its tag `slurmtrain_run_id`. Both get the config (secrets
as references), the plan, each attempt's provenance, the metrics and the ledger's events. Imported
on rank 0 only when a tracker is chosen (the packages are optional extras).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol

from slurmtrain.common import events, secrets
from slurmtrain.common.events import Row, Rows
from slurmtrain.common.schema import RootConfig

RUN_TAG = "slurmtrain_run_id"  # MLflow: the tag that finds the run again
MLFLOW_BATCH = 1000  # MLflow's log_batch takes at most 1000 metrics, 100 params

# The rows that carry a failure class (`cls`): counted and tagged by it.
CLASSED = (events.AttemptEnded, events.Stopped, events.Failed, events.RelaunchAbandoned)


def event_row(row: Row) -> dict[str, object]:
    """A ledger row as a tracker keeps it (its JSON form): credentials redacted (errors may quote
    them)."""
    return {
        k: secrets.redact_text(v) if isinstance(v, str) else v
        for k, v in row.to_json().items()
        if k not in ("nodes", "hosts", "pids")  # O(nodes) lists: the ledger has them
    }


def failure_class(row: Row) -> Optional[str]:
    """The failure class a row carries (None: a kind without one, or an empty class)."""
    return (row.cls or None) if isinstance(row, CLASSED) else None


class Backend(Protocol):
    """A tracker's end; `log(step, row, fresh)` and `close(step, kept, fresh)` (ledger rows: the
    new ones, the attempt's) are called by name (trackers.Trackers), so one that failed to open
    (`Failed`) needs only its kind. Rows reach a tracker as `event_row` writes them."""

    kind: str


@dataclass
class RunContext:
    cfg: RootConfig
    path: Path  # the run directory
    run_id: str  # trackers.tracker_run_id
    fingerprint: str
    attempt: int
    rows: Rows  # rank 0's run tier

    def config(self) -> dict[str, object]:
        """The resolved config with every secret as a reference (what config.yaml holds)."""
        return secrets.referenced(self.cfg)

    def plan(self) -> dict[str, object]:
        """The login node's plan again (pure arithmetic): parameters, memory per rank, ETA lines."""
        from slurmtrain.common.derived import node_range
        from slurmtrain.planning import memory, preflight

        out: dict[str, object] = {}
        try:
            out["params"] = memory.param_count(self.cfg.model)
            low = node_range(self.cfg.nodes)[0]
            out["memory_per_rank_bytes"] = preflight.memory_plan(self.cfg, low).total
            out["text"] = preflight.report(self.cfg).text
        except Exception as err:  # a plan the login node printed; here it is only a record
            out["error"] = f"{type(err).__name__}: {err}"
        return out

    def provenance(self) -> dict[str, object]:
        """This attempt's provenance record (written, redacted, by rank 0 before training)."""
        path = self.path / "provenance" / f"attempt_{self.attempt}.json"
        try:
            record: dict[str, object] = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return record

    def started(self) -> Optional[events.Started]:
        for row in reversed(self.rows):
            if isinstance(row, events.Started) and row.attempt == self.attempt:
                return row
        return None


def _flat(data: object, prefix: str = "") -> dict[str, str]:
    if isinstance(data, dict):
        out: dict[str, str] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): json.dumps(data) if not isinstance(data, str) else data}


def _outcome(kept: Rows) -> str:
    """How the attempt ended, for the tracker's run status: finished | failed | paused."""
    if any(isinstance(row, events.Finished) for row in kept):
        return "finished"
    return (
        "failed"
        if any(isinstance(row, (events.Failed, events.Stopped)) for row in kept)
        else "paused"
    )


def _jsonl(rows: Rows) -> str:
    return "".join(json.dumps(event_row(e), default=str) + "\n" for e in rows)


class Failed:
    """A tracker that could not open (kept for its name in the error line)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind


class WandbBackend:
    kind = "wandb"

    def __init__(self, ctx: RunContext) -> None:
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        c = ctx.cfg.logger.wandb
        assert c is not None  # opened only when chosen (trackers.wanted)
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
        name.write_text(_jsonl(kept))
        self.run.finish(exit_code=0 if _outcome(kept) != "failed" else 1)


class MlflowBackend:
    kind = "mlflow"

    def __init__(self, ctx: RunContext) -> None:
        c = ctx.cfg.logger.mlflow
        assert c is not None  # opened only when chosen (trackers.wanted)
        uri = c.tracking_uri or (ctx.path / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps its file store "in maintenance" behind this switch; a run directory
            # on a shared filesystem is where a file store belongs (SQLite there is not safe).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self.Metric, self.ctx = Metric, ctx
        self.client = client = MlflowClient(tracking_uri=uri)
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
            params = [Param(k, v[:6000]) for k, v in _flat(ctx.config()).items()]
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
        self.client.log_text(self.run_id, _jsonl(kept), f"events/attempt_{n}.jsonl")
        outcome = _outcome(kept)
        self.client.set_tag(self.run_id, f"attempt.{n}.outcome", outcome)
        status = {"finished": "FINISHED", "failed": "FAILED"}.get(outcome, "KILLED")
        self.client.set_terminated(self.run_id, status=status)


OPENERS: dict[str, Callable[[RunContext], Backend]] = {
    "wandb": WandbBackend,
    "mlflow": MlflowBackend,
}
