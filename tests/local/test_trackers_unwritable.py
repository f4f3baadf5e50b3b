"""Trackers are best effort, every one (issue 37): TensorBoard, W&B and MLflow each given a
directory they cannot create (a regular file stands where their folder goes: root writes through
any mode bits), in one tiny local run. The run finishes, each tracker left one warning line in the
job's log and one `tracker_failed` row, and `status` warns about each."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmtrain.common.events import Finished, TrackerFailed
from tests.conftest import dry_run_file, ledger_events, read_jsonl, run_cli

MAX = 2
ARGS = [
    "cluster=local",
    "gpus_per_node=0",
    "cluster.cpu_tasks_per_node=1",
    f"train.max_steps={MAX}",
    "train.log_interval=1",
    f"checkpoint.interval_steps={MAX}",
    "name=blocked",
    "logger=[tensorboard,wandb,mlflow]",
]


@pytest.fixture(scope="module")
def dropped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """(run directory, the run's output, status' output) of the run with all three blocked."""
    work = tmp_path_factory.mktemp("trackers")
    (work / "not_a_dir").write_text("")
    args = [*ARGS, f"logger.mlflow.tracking_uri={(work / 'not_a_dir' / 'mlruns').as_uri()}"]
    dry = run_cli([*args, "dry_run=true"], cwd=work)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    run = work / "runs" / "blocked" / dry_run_file(dry.stdout).parent.name
    run.mkdir(parents=True)
    for folder in ("tensorboard", "wandb"):  # RUN_DIR/tensorboard/attempt_1, RUN_DIR/wandb/...
        (run / folder).write_text("")
    done = run_cli(args, cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    status = run_cli(["status", str(run)], cwd=work, module="slurmtrain.cli")
    assert status.returncode == 0, status.stdout + status.stderr
    return run, done.stdout + done.stderr, status.stdout


def _check(dropped: tuple[Path, str, str], tracker: str) -> None:
    run, _, status = dropped
    rows = ledger_events(run)
    assert any(isinstance(e, Finished) for e in rows)  # training went on to the end
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")][-1] == MAX
    [failed] = [e for e in rows if isinstance(e, TrackerFailed) and e.tracker == tracker]
    assert failed.phase == "open" and "NotADirectoryError" in str(failed.error)
    log = "".join(p.read_text() for p in (run / "logs").glob("*_0.err"))
    assert log.count(f"slurmtrain: warning: tracker {tracker} failed at open") == 1
    assert f"{run.name}: warning: tracker {tracker} failed at open: NotADirectoryError" in status


def test_an_unwritable_tensorboard_directory_is_a_warning(dropped):
    _check(dropped, "tensorboard")


def test_an_unwritable_wandb_directory_is_a_warning(dropped):
    _check(dropped, "wandb")


def test_an_unwritable_mlflow_store_is_a_warning(dropped):
    _check(dropped, "mlflow")
