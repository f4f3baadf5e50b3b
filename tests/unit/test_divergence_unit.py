"""Divergence verdicts, rollback plans, checkpoint choice and pruning."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

from slurmtrain.common import events, ledger
from slurmtrain.common.checkpoint_format import prune, step_dirs
from slurmtrain.common.events import FailureClass
from slurmtrain.compute.checkpoint import select
from slurmtrain.compute.data import Sampler
from slurmtrain.compute.divergence import Divergence, Guard, plan_rollback, resumed_skip

FAULTS = SimpleNamespace(max_rollback=5, skip_batches=200)


def test_guard_judges_non_finite_and_spikes():
    g = Guard()
    assert g.judge(1, 5.0, 0) is None
    assert "non-finite" in g.judge(2, math.nan, 0).why
    assert "2 rank" in g.judge(3, 4.0, 2).why  # finite mean, but a rank saw inf/NaN
    spiky = Guard(spike_factor=3, window=20)
    for s in range(10):
        assert spiky.judge(s, 2.0 + 0.01 * s, 0) is None
    assert spiky.judge(11, 5.0, 0) is None
    assert "spike" in spiky.judge(12, 7.0, 0).why


def test_plan_rollback_skips_at_least_the_window_bounded_for_tiny_runs():
    d = Divergence(15, math.nan, "x")
    plan = plan_rollback(d, 10, 0, [], FAULTS, max_steps=40, global_batch=8)
    assert plan.stop is None and plan.to_step == 10 and plan.skip_steps == 5
    assert plan.skip_samples == 40
    big = plan_rollback(Divergence(1050, 9.9, "x"), 1000, 16, [], FAULTS, 100_000, 8)
    assert big.skip_steps == 200 and big.skip_samples == 16 + 200 * 8
    assert "no valid checkpoint" in plan_rollback(d, None, 0, [], FAULTS, 40, 8).stop
    again = [events.Rollback(step=15, to_step=10, skipped_samples=40)]
    assert "diverged again" in plan_rollback(d, 10, 40, again, FAULTS, 40, 8).stop
    many = [events.Rollback(to_step=s) for s in range(5)]
    assert "max_rollback=5" in plan_rollback(d, 10, 0, many, FAULTS, 40, 8).stop


def test_resumed_skip_follows_a_rollback_to_the_same_checkpoint():
    rb = [events.Rollback(to_step=10, data_skip=40)]
    assert resumed_skip(0, 10, rb) == 40 and resumed_skip(0, 20, rb) == 0


def test_sampler_skip_moves_every_batch():
    s = Sampler(10_000, 8, 1)
    first = s.indices(3, 0, 0, 4, 2, 8)
    s.skip = 8
    assert s.indices(2, 0, 0, 4, 2, 8) == first


def test_vanished_attempt_with_only_the_early_signal_is_preempted():
    ledger_rows = [
        events.Started(attempt=1),
        events.Signal(attempt=1, signal="SIGTERM", before_save=True),
    ]  # Slurm killed it mid-save: no checkpoint_saved, no attempt_ended
    assert ledger.vanished_class(ledger_rows, 1) == FailureClass.preempted
    open_attempt = ledger.unended_attempt(ledger_rows)
    assert open_attempt is not None and open_attempt.attempt == 1


def test_vanished_attempt_stopped_by_ctrl_c_is_cancelled_not_a_node_failure():
    ledger_rows = [
        events.Started(attempt=1),
        events.Signal(attempt=1, signal="SIGINT", before_save=True),
    ]  # a local run's Ctrl-C, then its command was killed before closing the attempt
    assert ledger.vanished_class(ledger_rows, 1) == FailureClass.cancelled


def test_new_classes_have_budgets():
    from slurmtrain.common.schema import FaultsConfig

    b = ledger.budgets(FaultsConfig())
    assert b[FailureClass.diverged] == 0 and b[FailureClass.checkpoint_unreadable] == 0


def _ckpt(root: Path, step: int, good: bool = True) -> None:
    d = root / f"step_{step}"
    d.mkdir(parents=True)
    (d / "a.pt").write_bytes(b"x" * 10)
    files = {"a.pt": {"size": 10 if good else 11}}
    (d / "manifest.json").write_text(json.dumps({"step": step, "files": files}))
    (root / "latest").write_text(f"step_{step}")


def test_choose_stops_when_published_checkpoints_all_fail(tmp_path):
    root = tmp_path / "ck"
    _ckpt(root, 10, good=False)
    _ckpt(root, 20, good=False)
    saved = [events.CheckpointSaved(step=s) for s in (10, 20)]
    ledger_rows = [events.Submitted(), *saved]
    c = select.choose(root, ledger_rows, "auto", full=True)
    assert c.found.path is None and "step_20: " in c.stop and "step_10: " in c.stop
    assert select.choose(
        tmp_path / "empty", ledger_rows, "auto", True
    ).stop  # unmounted: all missing
    assert (
        select.choose(tmp_path / "empty", ledger_rows[:1], "auto", True).stop is None
    )  # a new run


def test_resume_none_and_step_n_apply_once_and_move_checkpoints_aside(tmp_path):
    root = tmp_path / "ck"
    for s in (10, 20, 30):
        _ckpt(root, s)
    ledger_rows: events.Rows = [events.Submitted()]
    c = select.choose(root, ledger_rows, "step_20", full=True)
    assert c.found.path == root / "step_20"
    assert c.applied is not None and c.applied.moved == ("step_30",) and c.applied.kept_step == 20
    assert (root / "latest").read_text() == "step_20"
    assert ledger.resume_request(ledger_rows, "step_20") == "step_20"  # not applied yet
    ledger_rows.append(c.applied)
    assert ledger.resume_request(ledger_rows, "step_20") == "auto"  # a restart resumes normally
    assert ledger.published_since_reset(ledger_rows) == [events.CheckpointSaved(step=20)]
    ledger_rows += [events.CheckpointSaved(step=25), events.Submitted(requeue_of="7")]
    assert [e.step for e in ledger.published_since_reset(ledger_rows)] == [20, 25]
    assert ledger.resume_request(ledger_rows, "step_20") == "auto"  # a requeue asks nothing anew
    c = select.choose(root, [events.Submitted()], "none", full=True)
    assert c.found.path is None and c.applied is not None
    assert sorted(c.applied.moved) == ["step_10", "step_20"]
    assert step_dirs(root) == [] and not (root / "latest").exists()
    bad = select.choose(root, [events.Submitted()], "step_5", full=True)
    assert "no such checkpoint" in bad.stop


def test_prune_counts_only_valid_checkpoints_and_keeps_the_newest_valid(tmp_path):
    root = tmp_path / "ck"
    _ckpt(root, 10)
    _ckpt(root, 20)
    for s in (30, 40, 50):
        _ckpt(root, s, good=False)
    prune(root, keep_last=1)
    names = [d.name for d in step_dirs(root)]
    assert "step_20" in names and "step_10" not in names


def test_an_fp16_overflow_is_a_skipped_step_not_a_divergence():
    """The loss scaler skips a step whose gradients overflowed (grad norm inf on every rank) and
    halves its scale: that step changed nothing, so it is not a divergence."""
    g = Guard(max_overflow_steps=3)
    assert g.judge(1, 5.0, 0) is None
    for step in (2, 3, 4):  # a burst of overflows: the scale calibrating
        assert g.judge(step, 5.0, 2, skipped=1) is None
    assert g.judge(5, 4.9, 0) is None  # an applied step ends the burst
    for step in (6, 7, 8):
        assert g.judge(step, math.inf, 2, skipped=1) is None
    sustained = g.judge(9, 5.0, 2, skipped=1)  # the 4th in a row: it will not heal
    assert sustained is not None and "4 fp16 overflow steps in a row" in sustained.why
    assert "faults.max_overflow_steps=3" in sustained.why


def test_an_overflow_at_the_minimum_loss_scale_is_a_divergence():
    """DeepSpeed aborts the run at the next overflow once the scale is at its minimum: judged
    here first, so the run rolls back instead of crashing."""
    g = Guard()
    assert g.judge(1, 5.0, 2, skipped=1) is None
    floor = g.judge(2, 5.0, 2, skipped=1, scale_at_minimum=1)
    assert floor is not None and "minimum" in floor.why
    assert Guard().judge(3, math.nan, 1) is not None  # not skipped (bf16/fp32): non-finite


def test_overflow_steps_do_not_feed_the_spike_median():
    g = Guard(spike_factor=3, window=20)
    for s in range(10):
        assert g.judge(s, 2.0, 0) is None
    for s in range(10, 20):
        assert g.judge(s, 1e6, 2, skipped=1) is None  # skipped: not a sample of the loss
    assert "spike" in g.judge(20, 7.0, 0).why


def test_plan_rollback_after_a_repeat_goes_older_or_stops_naming_it():
    faults = SimpleNamespace(max_rollback=5, skip_batches=200, rollback_repeat_window=100)
    first = [events.Rollback(step=25, to_step=20, skipped_samples=40)]
    d = Divergence(25, math.nan, "x")
    older = plan_rollback(d, 10, 0, first, faults, 40, 8)
    assert older.stop is None and older.to_step == 10 and older.number == 2
    none_left = plan_rollback(d, None, 0, first, faults, 40, 8)
    assert "diverged again" in none_left.stop and "older" in none_left.stop


def test_prune_keeps_protected_steps_and_one_per_keep_every_span(tmp_path):
    from slurmtrain.common.checkpoint_format import publish

    for step in (5, 10, 15, 20, 25, 1007, 1010):
        (tmp_path / f"step_{step}.tmp").mkdir()
        (tmp_path / f"step_{step}.tmp" / "f.pt").write_bytes(b"x")
        publish(tmp_path, step, {}, "size")
    prune(tmp_path, keep_last=1, keep_every=1000, protect={15})
    kept = sorted(int(p.name.split("_")[1]) for p in step_dirs(tmp_path))
    # 15: protected; 1007: the first at or past step 1000 (saves by time land on any step);
    # 1010: the newest
    assert kept == [15, 1007, 1010]
