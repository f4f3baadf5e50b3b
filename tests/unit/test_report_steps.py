"""The report's step axis, learning-rate panel, thinned checkpoint markers and the user's pause
(issue #36, build 7): a synthetic ledger and metrics, drawn in-process with the Agg backend."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from slurmtrain.cli import report, report_steps  # noqa: E402
from slurmtrain.cli.goodput import analyze  # noqa: E402
from slurmtrain.common import events  # noqa: E402
from slurmtrain.common.events import FailureClass  # noqa: E402

T0 = 1_700_000_000.0
SAVE_EVERY, PAUSE = 5, 3_600.0


def ev(row: events.Row, t: float, attempt: int | None, job: str) -> events.Row:
    return dataclasses.replace(row, time=T0 + t, job_id=job, attempt=attempt, nodes=("n1",))


def ctrl_c_run(saves: int = 121, lr: bool = True) -> tuple[events.Rows, list[dict]]:
    """A local run saving every 5 steps: attempt 1 trains steps 1-300 and is stopped by Ctrl-C;
    the user runs it again an hour later; attempt 2 resumes at 300 and trains to saves * 5."""
    ledger: events.Rows = [ev(events.Submitted(executor="local"), 0, None, "1")]
    metrics: list[dict] = []
    t, last = 10.0, saves * SAVE_EVERY
    for attempt, first, end in ((1, 1, 300), (2, 301, last)):
        job = str(attempt)
        ledger.append(ev(events.Started(world_size=1), t, attempt, job))
        if attempt == 2:
            t += 2
            ledger.append(ev(events.CheckpointLoaded(step=300, seconds=2, path="p"), t, 2, job))
        for step in range(first, end + 1):
            t += 2.0
            row = {"step": step, "time": T0 + t, "attempt": attempt, "step_time": 2.0}
            row |= {"loss": 2 + 8 * math.exp(-step / 150), "tokens_per_s": 1000.0}
            if lr:
                row["lr"] = 1e-3 * min(1.0, step / 50) * 0.5 * (1 + math.cos(math.pi * step / last))
            metrics.append(row)
            if step % SAVE_EVERY == 0:
                t += 1
                saved = events.CheckpointSaved(
                    step=step, seconds=1, total_seconds=1, bytes=1, path="p"
                )
                ledger.append(ev(saved, t, attempt, job))
        if attempt == 1:
            t += 3
            ended = events.AttemptEnded(cls=FailureClass.cancelled, closed_by="ctrl-c")
            ledger.append(ev(ended, t, 1, job))
            t += PAUSE
            ledger.append(ev(events.Submitted(executor="local"), t, None, "2"))
            t += 5
    ledger.append(ev(events.Finished(step=last), t + 1, 2, "2"))
    return ledger, metrics


def test_ordinal() -> None:
    assert [report_steps.ordinal(n) for n in (1, 2, 3, 4, 7, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "7th", "11th", "12th", "13th", "21st", "22nd", "101st",
    ]  # fmt: skip


def test_121_checkpoints_are_thinned_keeping_first_last_and_resumed() -> None:
    ledger, _ = ctrl_c_run()
    th = report_steps.thin_checkpoints(ledger)
    steps = [e.step for e in th.rows]
    assert th.total == 121 and th.every == 7 and len(steps) <= report_steps.MOST_CHECKPOINTS + 2
    assert {5, 300, 605} <= set(steps)  # first, resumed from, last
    assert th.label == "checkpoints (every 7th of 121)"


def test_a_few_checkpoints_are_all_drawn() -> None:
    ledger, _ = ctrl_c_run(saves=62)
    few = [e for e in ledger if not isinstance(e, events.CheckpointSaved) or e.step % 50 == 0]
    th = report_steps.thin_checkpoints(few)
    assert th.every == 1 and th.total == 6 and th.label == "checkpoint saved"


def test_loss_and_learning_rate_against_the_step() -> None:
    ledger, metrics = ctrl_c_run()
    fig, (ax_loss, ax_lr) = plt.subplots(2, 1)
    handles = report_steps.step_panels(ax_loss, ax_lr, metrics, ledger)
    loss_lines = [ln for ln in ax_loss.get_lines() if ln.get_label() == "train loss"]
    assert [(ln.get_xdata()[0], ln.get_xdata()[-1]) for ln in loss_lines] == [(1, 300), (301, 605)]
    lr = [ln for ln in ax_lr.get_lines() if len(ln.get_xdata()) > 2]
    assert len(lr) == 2 and max(max(ln.get_ydata()) for ln in lr) == pytest.approx(1e-3, rel=0.05)
    assert ax_lr.get_xlabel() == "step"
    ckpt_lines = [
        ln for ln in ax_loss.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) == 2
    ]
    assert 0 < len(ckpt_lines) <= report_steps.MOST_CHECKPOINTS + 2  # not a barcode of 121
    labels = [h.get_label() for h in handles]
    assert "checkpoints (every 7th of 121)" in labels and "resumed from" in labels
    plt.close(fig)


def test_no_lr_logged_says_so() -> None:
    ledger, metrics = ctrl_c_run(saves=62, lr=False)
    fig, (ax_loss, ax_lr) = plt.subplots(2, 1)
    report_steps.step_panels(ax_loss, ax_lr, metrics, ledger)
    assert any("no lr in metrics.jsonl" in t.get_text() for t in ax_lr.texts)
    plt.close(fig)


def test_wall_time_panels_thin_checkpoints_and_hatch_the_pause() -> None:
    ledger, metrics = ctrl_c_run()
    a = analyze(ledger, metrics)
    assert a.goodput.user_paused == pytest.approx(PAUSE)
    fig, axes = plt.subplots(3, 1)
    thinned = report_steps.thin_checkpoints(ledger)
    handles = report._markers(axes, ledger, a.goodput.start, 60.0, thinned)
    assert "checkpoints (every 7th of 121)" in [h.get_label() for h in handles]
    assert len(axes[0].get_lines()) <= report_steps.MOST_CHECKPOINTS + 2 + 2  # and 2 starts
    patches = report._pauses(axes, a, a.goodput.start, 60.0)
    assert [p.get_label() for p in patches] == ["paused by you (not in goodput)"]
    assert patches[0].get_hatch() and len(axes[0].patches) == 1
    plt.close(fig)


def test_report_of_a_paused_run(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    ledger, metrics = ctrl_c_run()
    (run / "ledger.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in ledger))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    assert report.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "paused by you" in out and "left out" in out
    png = run / "report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 50_000 < png.stat().st_size < 600_000
