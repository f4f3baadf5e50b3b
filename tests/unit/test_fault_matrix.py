"""bench/fault_matrix.py's figures, from hand-made ledgers (the bench itself needs the cluster)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from slurmtrain.common.jsonl import append_jsonl
from slurmtrain.common.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("fault_matrix", ROOT / "bench" / "fault_matrix.py")
fm = importlib.util.module_from_spec(spec)
sys.modules["fault_matrix"] = fm  # dataclasses look their module up there
spec.loader.exec_module(fm)


def trial(tmp_path: Path, ledger: list[dict], metrics: list[tuple[int, int, float]]) -> "fm.Trial":
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    for row in ledger:
        append_jsonl(run.path / "ledger.jsonl", row)
    for attempt, step, t in metrics:
        append_jsonl(run.metrics, {"attempt": attempt, "step": step, "time": t})
    t = fm.Trial(tmp_path, "x")
    t.run = run.path
    return t


def ev(event: str, t: float, job: str, attempt: int, **kw) -> dict:
    return {"event": event, "time": t, "job_id": job, "attempt": attempt, **kw}


def test_a_second_job_that_starts_while_the_first_trains_is_a_duplicate(tmp_path):
    # what the duplicate_submission trial recorded before the one-owner fix (jobs 85 and 86)
    ledger = [
        ev("started", 632.9, "85", 1),
        ev("checkpoint_saved", 648.0, "85", 1, step=10),
        ev("attempt_ended", 652.0, "86", 1, **{"class": "node_failure"}),  # closed by job 86
        ev("started", 652.0, "86", 2),
        ev("checkpoint_saved", 652.3, "85", 1, step=20),
        ev("finished", 660.8, "85", 1, step=40),
        ev("checkpoint_loaded", 662.7, "86", 2, step=20, path="/r/checkpoints/step_20"),
        ev("finished", 667.7, "86", 2, step=40),
    ]
    metrics = [(1, s, 640 + s / 2) for s in range(1, 41)] + [(2, s, 665 + s / 20) for s in (21, 40)]
    t = trial(tmp_path, ledger, metrics)
    assert fm.duplicate_trainers(t) is True
    assert fm.steps_lost(t) == 20
    assert fm.corrupt_resumes(t) == 0


def test_a_clean_restart_is_no_duplicate_and_loses_what_followed_the_checkpoint(tmp_path):
    ledger = [
        ev("started", 100, "1", 1),
        ev("checkpoint_saved", 110, "1", 1, step=10),
        ev("attempt_ended", 125, "1", 1, **{"class": "crash"}),
        ev("started", 130, "2", 2),
        ev("attempt_ended", 131, "2", 1, **{"class": "crash"}),  # a closer's late row
        ev("checkpoint_loaded", 132, "2", 2, step=10, path="/r/checkpoints/step_10"),
        ev("finished", 150, "2", 2, step=30),
    ]
    metrics = [(1, s, 100 + s) for s in range(1, 18)] + [(2, s, 120 + s) for s in range(11, 31)]
    t = trial(tmp_path, ledger, metrics)
    assert fm.duplicate_trainers(t) is False
    assert fm.steps_lost(t) == 7
    assert fm.class_recorded(t, "crash") and not fm.class_recorded(t, "hang")


def test_loading_an_unpublished_or_corrupted_checkpoint_is_a_corrupt_resume(tmp_path):
    ledger = [
        ev("started", 1, "1", 1),
        ev("checkpoint_saved", 2, "1", 1, step=10),
        ev("started", 5, "2", 2),
        ev("checkpoint_loaded", 6, "2", 2, step=20, path="/r/checkpoints/step_20.tmp"),
        ev("started", 8, "3", 3),
        ev("checkpoint_loaded", 9, "3", 3, step=10, path="/r/checkpoints/step_10"),
    ]
    t = trial(tmp_path, ledger, [])
    assert fm.corrupt_resumes(t) == 1
    t.corrupted.add("step_10")
    assert fm.corrupt_resumes(t) == 2


def test_the_table_has_one_row_per_fault():
    rows = [
        {
            "fault": "crash_loop",
            "recovered": True,
            "lost": 6,
            "dup": False,
            "corrupt": 0,
            "class_ok": True,
        },
        {
            "fault": "crash_loop",
            "recovered": False,
            "lost": None,
            "dup": None,
            "corrupt": None,
            "class_ok": False,
        },
    ]
    text = fm.table(rows).splitlines()
    # the table, then the culprit summary over node-at-fault faults and over user errors
    assert len(text) == 5 and "steps lost (max)" in text[0] and "culprit recall" in text[0]
    assert text[3].startswith("culprit, node-at-fault faults: 0 trials")
    assert text[4].startswith("culprit, configuration/user errors: 0 trials")
    assert [c.strip() for c in text[2].split("|")] == [
        "crash_loop",
        "2",
        "1/2",
        "6",
        "0",
        "0",
        "1/2",
        "-",
        "-",
    ]
    assert set(fm.FAULTS) >= {"time_limit", "controller_restart", "sigterm_batch_shell"}
    assert {"hand_job_then_cancel", "inject_without_opt_in"} <= set(fm.FAULTS)
    assert len(fm.FAULTS) >= 17  # 15 base faults, a node whose ranks never join, invisible GPUs
    assert set(fm.FAULTS) >= {"load_failure", "converter_signal", "final_step_signal"}
    assert {"resubmit_after_stop", "held_successor", "supervisor_exception"} <= set(fm.FAULTS)
