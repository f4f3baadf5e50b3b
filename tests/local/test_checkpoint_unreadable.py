"""No silent restart: when every published checkpoint is unreadable the attempt
stops `checkpoint_unreadable` and trains nothing; `resume=none` then starts from step 0."""

from __future__ import annotations

from pathlib import Path

from slurmtrain.common.events import (
    CheckpointLoaded,
    CheckpointSaved,
    FailureClass,
    Finished,
    Paused,
    ResumeApplied,
    Started,
    Stopped,
)
from tests.conftest import ledger_of, read_jsonl, run_cli, run_dirs

BASE = ["train.max_steps=40", "train.log_interval=1", "checkpoint.interval_steps=10"]


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_all_checkpoints_corrupt_stops_then_resume_none_trains_from_zero(workdir):
    paused = run_cli(BASE + ["train.pause_at_step=20"], cwd=workdir)
    [run] = run_dirs(workdir / "runs")
    assert ledger_of(run, Paused), paused.stdout + paused.stderr  # unfinished: the next one resumes
    assert [e.step for e in ledger_of(run, CheckpointSaved)] == [10, 20]
    for step in (10, 20):
        flip(run / "checkpoints" / f"step_{step}" / "mp_rank_00_model_states.pt")
    rows_before = len(read_jsonl(run / "metrics.jsonl"))

    refused = run_cli(BASE, cwd=workdir)
    [stopped] = ledger_of(run, Stopped)
    assert stopped.cls == FailureClass.checkpoint_unreadable, refused.stdout + refused.stderr
    assert "step_20: " in stopped.error and "step_10: " in stopped.error
    assert "checksum mismatch" in stopped.error and "resume=none" in stopped.error
    assert "run stopped (checkpoint_unreadable)" in refused.stdout
    assert len(read_jsonl(run / "metrics.jsonl")) == rows_before  # nothing trained
    assert not ledger_of(run, CheckpointLoaded)
    assert (run / "checkpoints" / "step_20").is_dir()  # nothing deleted

    bad = run_cli(BASE + ["resume=step_x"], cwd=workdir)
    assert bad.returncode == 2 and "resume='step_x'" in bad.stdout + bad.stderr

    fresh = run_cli(BASE + ["resume=none"], cwd=workdir)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    [applied] = ledger_of(run, ResumeApplied)
    assert applied.resume == "none" and sorted(applied.moved) == ["step_10", "step_20"]
    assert not ledger_of(run, CheckpointLoaded) and ledger_of(run, Finished)
    last_attempt = max(e.attempt for e in ledger_of(run, Started))
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["attempt"] == last_attempt]
    assert [r["step"] for r in rows] == list(range(1, 41))  # from step 0
    assert len(list((run / "checkpoints" / "discarded").glob("*/step_20"))) == 1
