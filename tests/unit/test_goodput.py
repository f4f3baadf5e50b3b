"""Goodput parts of a hand-made chain of three attempts: time-limit requeue, crash with lost steps, finish."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmtrain.cli.goodput import PARTS, analyze, compute_goodput, format_line, format_table
from slurmtrain.common import events
from slurmtrain.common.events import FailureClass

T0 = 1_700_000_000.0


def ev(row: events.Row, t: float, attempt: int | None) -> events.Row:
    """`row` placed: at T0 + t, by job 100's attempt `attempt` on n1."""
    return dataclasses.replace(row, time=T0 + t, job_id="100", attempt=attempt, nodes=("n1",))


def steps(attempt: int, first: int, last: int, first_end: float, dt: float = 10.0) -> list[dict]:
    return [
        {
            "step": s,
            "time": T0 + first_end + (s - first) * dt,
            "attempt": attempt,
            "loss": 5.0 / s,
            "tokens_per_s": 1000.0,
            "step_time": dt,
        }
        for s in range(first, last + 1)
    ]


def hand_made_run() -> tuple[events.Rows, list[dict]]:
    """Attempt 1: fresh start, USR2 at t=285, save, requeue. Attempt 2: resume 16, crash at 23 after
    saving 20. Attempt 3: resume 20 (steps 21-23 recomputed), finish at 25. Wall 705 s."""
    saved = {"seconds": 10, "total_seconds": 12, "bytes": 1, "path": "p"}
    ledger = [
        ev(events.Submitted(fingerprint="abc"), 0, None),
        ev(events.Started(world_size=2, hosts=("n1",)), 100, 1),
        ev(events.RendezvousDone(seconds=10), 110, 1),
        ev(events.HealthOk(seconds=10), 120, 1),
        ev(events.CheckpointSaved(step=10, **saved), 230, 1),
        ev(events.Signal(signal="USR2", step=15), 285, 1),
        ev(events.CheckpointSaved(step=16, **saved), 300, 1),
        ev(events.Requeued(reason="time limit"), 305, 1),
        ev(events.Started(world_size=2, hosts=("n1",)), 405, 2),
        ev(events.RendezvousDone(seconds=10), 415, 2),
        ev(events.HealthOk(seconds=5), 420, 2),
        ev(events.CheckpointLoaded(step=16, seconds=5, path="p"), 430, 2),
        ev(events.CheckpointSaved(step=20, **saved), 480, 2),
        ev(events.Failed(cls=FailureClass.crash, error="RuntimeError", step=23), 515, 2),
        ev(events.Started(world_size=2, hosts=("n1",)), 615, 3),
        ev(events.CheckpointLoaded(step=20, seconds=5, path="p"), 640, 3),
        ev(events.CheckpointSaved(step=25, **saved), 700, 3),
        ev(events.Finished(step=25), 705, 3),
    ]
    metrics = (
        steps(1, 1, 10, 130)
        + steps(1, 11, 16, 240)
        + steps(2, 17, 20, 440)
        + steps(2, 21, 23, 490)
        + steps(3, 21, 25, 650)
    )
    return ledger, metrics


def write_run(path: Path, ledger: events.Rows, metrics: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "ledger.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in ledger))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    return path


def test_hand_made_parts_have_the_expected_seconds(tmp_path: Path) -> None:
    g = compute_goodput(write_run(tmp_path / "run", *hand_made_run()))
    expected = {
        "queue_wait": 300,
        "startup": 60,
        "checkpoint_load": 10,
        "productive": 250,
        "checkpoint_save": 40,
        "work_lost": 30,
        "signal_idle": 5,
        "other": 10,
        "user_paused": 0,
    }
    assert g.parts() == pytest.approx(expected, abs=1e-6)
    assert g.wall == pytest.approx(705)
    assert g.goodput == pytest.approx(250 / 705)
    assert (g.attempts, g.steps_kept, g.steps_lost, g.live) == (3, 25, 3, False)


def test_parts_add_up_to_wall_time_exactly() -> None:
    g = analyze(*hand_made_run()).goodput
    assert sum(g.parts().values()) == pytest.approx(g.wall, rel=1e-12)


def test_lost_records_are_the_recomputed_steps() -> None:
    a = analyze(*hand_made_run())
    assert a.lost_records == {(2, 21), (2, 22), (2, 23)}


def test_live_run_counts_up_to_now_and_survives_a_torn_line(tmp_path: Path) -> None:
    ledger, metrics = hand_made_run()
    run = write_run(tmp_path / "run", ledger[:9], [m for m in metrics if m["attempt"] == 1])
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 17, "time": ')  # writer killed mid-line
    g = compute_goodput(run, now=T0 + 500)
    assert g.live and g.end == T0 + 500 and g.wall == pytest.approx(500)
    assert g.queue_wait == pytest.approx(200)  # 0-100 and 305-405
    assert g.startup == pytest.approx(20 + 95)  # attempt 2 has done no work yet
    assert sum(g.parts().values()) == pytest.approx(g.wall)
    assert compute_goodput(run).end == T0 + 405  # without now: the last record


def test_requeued_run_waits_in_queue_until_now() -> None:
    ledger, metrics = hand_made_run()
    g = analyze(ledger[:8], metrics[:16], now=T0 + 400).goodput
    assert g.live and g.queue_wait == pytest.approx(100 + 95)


def test_failed_run_loses_steps_after_its_last_checkpoint() -> None:
    ledger, metrics = hand_made_run()
    g = analyze(ledger[:14], [m for m in metrics if m["attempt"] < 3]).goodput
    assert not g.live and g.work_lost == pytest.approx(30) and g.steps_lost == 3


def test_sparse_logging_counts_every_step_in_the_window() -> None:
    ledger = [
        ev(events.Submitted(), 0, None),
        ev(events.Started(), 10, 1),
        ev(events.Finished(step=10), 120, 1),
    ]
    metrics = [
        {"step": s, "time": T0 + 20 + 10 * s, "attempt": 1, "step_time": 10.0} for s in (5, 10)
    ]
    g = analyze(ledger, metrics).goodput
    assert g.productive == pytest.approx(100) and g.startup == pytest.approx(10)
    assert g.steps_kept == 10


def test_empty_run_is_zero(tmp_path: Path) -> None:
    g = compute_goodput(tmp_path)
    assert g.wall == 0 and g.goodput == 0 and "goodput 0.0%" in format_line(g)


def test_formatters_name_every_part() -> None:
    g = analyze(*hand_made_run()).goodput
    line, table = format_line(g), format_table(g)
    assert "\n" not in line and line.startswith("goodput 35.5% of 11m45s wall")
    for label in (
        "queue wait",
        "start-up",
        "ckpt load",
        "productive",
        "ckpt save",
        "work lost",
        "other",
    ):
        assert label in table
    assert "705.0" in table


event_kinds = st.sampled_from(
    [
        events.Started,
        events.CheckpointLoaded,
        events.CheckpointSaved,
        events.Signal,
        events.Requeued,
        events.Failed,
        events.Finished,
        events.HealthOk,
        events.Paused,  # a user's stop, then a user's Submitted: "paused by you"
        events.Cancelled,
        events.Submitted,
    ]
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(event_kinds, st.floats(0, 1e4), st.integers(1, 4), st.floats(0, 500)), max_size=30
    ),
    st.lists(
        st.tuples(st.integers(1, 50), st.floats(0, 1e4), st.integers(1, 4), st.floats(0, 300)),
        max_size=40,
    ),
    st.one_of(st.none(), st.floats(0, 2e4)),
)
def test_parts_always_sum_to_wall(evs, mets, now) -> None:
    # Every kind with a step and seconds (a kind without such fields keeps them as extra keys).
    ledger = [ev(events.Submitted(), 0, None)] + [
        ev(events.parse({"event": k.kind, "step": int(s) % 50, "seconds": s}), t, a)
        for k, t, a, s in evs
    ]
    metrics = [{"step": s, "time": T0 + t, "attempt": a, "step_time": d} for s, t, a, d in mets]
    g = analyze(ledger, metrics, None if now is None else T0 + now).goodput
    assert all(getattr(g, p) >= 0 for p in PARTS)
    assert sum(g.parts().values()) == pytest.approx(g.wall, rel=1e-9, abs=1e-6)
