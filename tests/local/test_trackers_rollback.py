"""Trackers across a rollback: steps 11-14 are trained twice after a NaN at step 15
rolls back to step 10; W&B and MLflow still get 1..max_steps once each, in order, and the rollback
as an event on the step axis. Then `cli sync` finds the offline W&B run (the upload itself needs
W&B's servers: --dry-run here)."""

from __future__ import annotations

from tests.conftest import read_jsonl, run_cli, run_dirs
from tests.tracker_files import mlflow_runs, mlflow_steps, wandb_offline

MAX = 20
TOKEN = "hf_" + "Q7x" * 10  # a credential in the config: never in a tracker's files
BASE = [f"train.max_steps={MAX}", "train.log_interval=1", "checkpoint.interval_steps=10"]


def test_a_rollback_keeps_the_trackers_step_axis_monotonic_and_complete(workdir):
    done = run_cli(
        [*BASE, "logger=[tensorboard,wandb,mlflow]", "faults.allow_inject=true", "name=tr"]
        + [f"+cluster.env.HF_TOKEN={TOKEN}"],
        cwd=workdir,
        env={"SLURMTRAIN_INJECT": "nan_at_step=15"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(workdir / "runs")
    logged = [row["step"] for row in read_jsonl(run / "metrics.jsonl")]
    assert logged.count(12) == 2  # trained twice: the rollback happened
    [part] = wandb_offline(run)
    assert part["run_id"] == f"tr-{run.name}" and part["steps"] == list(range(1, MAX + 1))
    [marked] = [row["_step"] for row in part["rows"] if "event/rollback" in row]
    assert marked == 15  # the first step past the ones logged before the rollback
    [found] = mlflow_runs(run)
    assert mlflow_steps(run, found.info.run_id) == list(range(1, MAX + 1))
    assert (run / "tensorboard").is_dir()
    for store in ("wandb", "mlruns"):
        leaked = [
            p for p in (run / store).rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()
        ]
        assert not leaked, leaked

    synced = run_cli(["sync", str(run), "--dry-run"], cwd=workdir, module="slurmtrain.cli")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert "1 offline W&B folder(s) -> one run" in synced.stdout
    assert "MLflow file store" in synced.stdout

    # --mlflow-uri copies the run to another store (a file store standing in for a server); a
    # second sync adds nothing twice
    target = (workdir / "server").resolve().as_uri()
    for _ in range(2):
        copied = run_cli(
            ["sync", str(run), "--only", "mlflow", "--mlflow-uri", target],
            cwd=workdir,
            module="slurmtrain.cli",
        )
        assert copied.returncode == 0, copied.stdout + copied.stderr
        assert "MLflow run tr-" in copied.stdout and "W&B" not in copied.stdout
    import os

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    server = MlflowClient(tracking_uri=target)
    [copy] = server.search_runs([e.experiment_id for e in server.search_experiments()])
    steps = [m.step for m in server.get_metric_history(copy.info.run_id, "loss")]
    assert steps == list(range(1, MAX + 1)) and copy.data.tags["attempt"] == "1"
