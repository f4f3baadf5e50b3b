"""The report CLI writes a real PNG and a text summary for a run of three attempts."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

from slurmtrain.cli import report
from slurmtrain.common import events
from slurmtrain.common.events import FailureClass

T0 = 1_700_000_000.0


def make_run(path: Path, with_mfu: bool = True) -> Path:
    """Attempt 1 hits the time limit (USR2, save, requeue); attempt 2 crashes 40 steps after its last
    save; attempt 3 resumes from step 400 and finishes at 600. One step = 6 s, save every 100 steps."""
    ledger: events.Rows = [events.Submitted(time=T0, job_id="7")]
    metrics: list[dict] = []

    def ev(row: events.Row, t: float, attempt: int) -> None:
        where = {"time": t, "job_id": "7", "attempt": attempt, "nodes": ("n1", "n2")}
        ledger.append(dataclasses.replace(row, **where))

    t = T0 + 600
    plan = [(1, 0, 250, "requeue"), (2, 250, 440, "crash"), (3, 400, 600, "finish")]
    for attempt, first, last, end in plan:
        ev(events.Started(world_size=16, hosts=("n1", "n2")), t, attempt)
        ev(events.RendezvousDone(seconds=20), t + 20, attempt)
        ev(events.HealthOk(seconds=15), t + 35, attempt)
        t += 35
        if first:
            t += 25
            ev(events.CheckpointLoaded(step=first, seconds=25, path=f"step_{first}"), t, attempt)
        for step in range(first + 1, last + 1):
            t += 6.0
            row = {
                "step": step,
                "time": t,
                "attempt": attempt,
                "loss": 2 + 8 * math.exp(-step / 150),
                "tokens_per_s": 40_000 + 3_000 * math.sin(step / 9),
                "step_time": 6.0,
            }
            if with_mfu:
                row["mfu"] = 0.42 + 0.02 * math.sin(step / 13)
            metrics.append(row)
            if step % 100 == 0 or (end == "requeue" and step == last):
                t += 30
                saved = events.CheckpointSaved(
                    step=step, seconds=30, total_seconds=45, bytes=1, path="p"
                )
                ev(saved, t, attempt)
        if end == "requeue":
            ev(events.Signal(signal="USR2", step=last), t - 40, attempt)
            t += 5
            ev(events.Requeued(reason="time limit"), t, attempt)
            t += 900
        elif end == "crash":
            t += 3
            crash = FailureClass.crash
            ev(events.Failed(cls=crash, error="RuntimeError: loss is NaN", step=last), t, attempt)
            t += 400
        else:
            t += 2
            ev(events.Finished(step=last), t, attempt)
    path.mkdir(parents=True, exist_ok=True)
    (path / "ledger.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in ledger))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    return path


def test_report_writes_a_png_and_a_summary(tmp_path: Path, capsys) -> None:
    run = make_run(tmp_path / "run")
    assert report.main([str(run)]) == 0
    png = run / "report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 50_000  # five drawn panels, not an empty canvas
    out = capsys.readouterr().out
    assert "attempts  3" in out and "failures  crash 1" in out and "lost 40" in out
    assert "productive" in out and "goodput" in out


def test_report_without_mfu_and_custom_out(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", with_mfu=False)
    out = tmp_path / "plots" / "r.png"
    assert report.main([str(run), "--out", str(out)]) == 0
    assert out.stat().st_size > 30_000


def test_report_refuses_a_directory_that_is_not_a_run(tmp_path: Path, capsys) -> None:
    assert report.main([str(tmp_path)]) == 2
    assert "run_dir=" in capsys.readouterr().err


def test_report_module_does_not_import_torch() -> None:
    code = (
        "import sys, slurmtrain.cli.report, slurmtrain.cli.logs, slurmtrain.cli.goodput; "
        "print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["False", "False"]
