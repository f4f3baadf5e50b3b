"""One tiny local run, two submissions, for issue 37's local items (each CLI run costs a process
start, torch and DeepSpeed: ~8 s here, so they share one):

1. Build 6: a crash past `faults.max_crash=0` is a budget stop the local executor records when the
   job ends: status says `stopped` at once, and the user's rerun after a fix trains in a new
   budget window (the stop was recorded only by the next start, which stopped that rerun at once).
2. Build 4: that rerun is given TensorBoard, W&B, MLflow and Aim, each pointed at a directory it
   cannot create (a regular file stands where its folder goes: root writes through any mode bits).
   The run finishes, each tracker left one warning line in the job's log and one `tracker_failed`
   row, and `status` warns about each."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

from slurmtrain.common.events import AttemptEnded, BudgetWindow, Finished, Stopped, TrackerFailed
from tests.conftest import ledger_of, read_jsonl, run_cli, run_dirs

MAX = 2
BASE = ["cluster=local", "gpus_per_node=0", "cluster.cpu_tasks_per_node=1",
        f"train.max_steps={MAX}", "train.log_interval=1", f"checkpoint.interval_steps={MAX}",
        "faults.allow_inject=true", "faults.max_crash=0"]  # fmt: skip
# tracker -> the error its open meets (Aim makes its folder with exist_ok=False: "File exists")
TRACKERS = {"tensorboard": "NotADirectoryError", "wandb": "NotADirectoryError",
            "mlflow": "NotADirectoryError", "aim": "FileExistsError"}  # fmt: skip
FOLDERS = ("tensorboard", "wandb", "aim")  # under RUN_DIR; MLflow's store is a URI (below)


def _status(run: Path) -> str:
    """`slurmtrain status RUN`'s output, in-process (a CLI process would only add its start-up)."""
    from slurmtrain.cli import status

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert status.main([str(run)]) == 0
    return out.getvalue()


class Story(NamedTuple):
    run: Path
    crashed: str  # the crashed submission's output
    stops: list[Stopped]  # the run's stops before the rerun
    stopped_status: str  # status right after it
    fixed: str  # the fixed rerun's output
    status: str  # status after the rerun


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Story:
    work = tmp_path_factory.mktemp("stop_then_trackers")
    crashed = run_cli(BASE, cwd=work, env={"SLURMTRAIN_INJECT": "crash_at_step=1"})
    [run] = run_dirs(work / "runs")
    stops = ledger_of(run, Stopped)  # recorded by the job that crashed, not by the next start
    stopped = _status(run)
    for folder in FOLDERS:  # `logger` is not in the fingerprint: the same run, trackers blocked
        shutil.rmtree(run / folder, ignore_errors=True)  # the crashed attempt's TensorBoard
        (run / folder).write_text("")
    (work / "not_a_dir").write_text("")
    mlflow = (work / "not_a_dir" / "mlruns").as_uri()
    trackers = [f"logger=[{','.join(TRACKERS)}]", f"logger.mlflow.tracking_uri={mlflow}"]
    fixed = run_cli([*BASE, *trackers], cwd=work)  # the fix: no injected crash
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    return Story(
        run,
        crashed.stdout + crashed.stderr,
        stops,
        stopped,
        fixed.stdout + fixed.stderr,
        _status(run),
    )


def test_a_crash_past_the_budget_is_stopped_at_once_and_the_fixed_rerun_trains(story):
    run, out = story.run, story.crashed
    [stop] = story.stops
    assert stop.cls == "crash" and "injected crash at step 1" in stop.error, out
    assert "slurmtrain: run stopped (crash): RuntimeError: injected crash at step 1" in out
    [ended] = ledger_of(run, AttemptEnded)  # the crashed attempt closed once
    assert (ended.cls, ended.attempt, ended.job_id) == ("crash", 1, stop.job_id)
    assert "stopped: crash" in story.stopped_status, story.stopped_status
    assert ledger_of(run, Finished), story.fixed
    assert len(ledger_of(run, Stopped)) == 1  # the rerun was not stopped again at its start
    [window] = ledger_of(run, BudgetWindow)
    assert window.after_class == "crash" and window.after_job_id == stop.job_id


@pytest.mark.parametrize("tracker", TRACKERS)
def test_an_unwritable_tracker_directory_is_a_warning_and_the_run_finishes(story, tracker):
    run = story.run
    assert ledger_of(run, Finished), story.fixed  # training went on to the end
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")][-1] == MAX
    [failed] = [e for e in ledger_of(run, TrackerFailed) if e.tracker == tracker]
    assert failed.phase == "open" and TRACKERS[tracker] in str(failed.error), failed
    log = "".join(p.read_text() for p in (run / "logs").glob("*_0.err"))
    assert log.count(f"slurmtrain: warning: tracker {tracker} failed at open") == 1
    line = f"{run.name}: warning: tracker {tracker} failed at open: {TRACKERS[tracker]}"
    assert line in story.status, story.status
