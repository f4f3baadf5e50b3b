"""Branch a run: after an injected divergence, `resume_from=PARENT:step_N` with a
lower lr trains a new run from the parent's step N (weights, optimizer, step count), records the
lineage, leaves the parent's checkpoint untouched, and the same command again resumes the branch."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import yaml

from slurmtrain.common.ds_config import lr_at
from slurmtrain.common.events import (
    Branched,
    CheckpointLoaded,
    FailureClass,
    Finished,
    Paused,
    Rollback,
    Stopped,
)
from tests.conftest import ledger_of, read_jsonl, run_cli, run_dirs

BASE = ["train.max_steps=40", "train.log_interval=1", "checkpoint.interval_steps=10"]
DIVERGE = {"SLURMTRAIN_INJECT": "nan_at_step=15,nan_repeat=1"}


def checksums(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def losses(run: Path) -> dict[int, dict]:
    return {row["step"]: row for row in read_jsonl(run / "metrics.jsonl") if "loss" in row}


def test_branch_after_divergence_continues_from_the_parent_step_with_the_new_lr(workdir):
    parent_done = run_cli([*BASE, "faults.allow_inject=true"], cwd=workdir, env=DIVERGE)
    [parent] = run_dirs(workdir / "runs")
    [stopped] = ledger_of(parent, Stopped)
    assert stopped.cls == FailureClass.diverged, parent_done.stdout + parent_done.stderr
    step_10 = parent / "checkpoints" / "step_10"
    before = checksums(step_10)
    parent_rows = losses(parent)

    branch = ["train.max_steps=20", "optim.lr=5e-4", "train.pause_at_step=15"]
    first = run_cli(BASE[1:] + branch + [f"resume_from={parent}:step_10"], cwd=workdir)
    child = next(p for p in run_dirs(workdir / "runs") if p != parent)
    assert ledger_of(child, Paused), first.stdout + first.stderr  # unfinished: the next resumes
    assert child.parent == parent.parent and child.name != parent.name  # its own fingerprint

    # Lineage: parent, step and the changed keys, in the ledger and in status.
    [branched] = ledger_of(child, Branched)
    assert branched.parent == str(parent) and branched.step == 10
    assert branched.parent_fingerprint == parent.name
    assert branched.changed["optim.lr"] == [0.001, 0.0005]
    assert branched.changed["train.max_steps"] == [40, 20]
    status = run_cli([str(child)], cwd=workdir, module="slurmtrain.cli.status")
    assert f"branched from {parent} at step_10" in status.stdout, status.stdout + status.stderr
    assert "optim.lr 0.001->0.0005" in status.stdout
    report = run_cli([str(child)], cwd=workdir, module="slurmtrain.cli.report")
    assert f"lineage   branched from {parent} at step_10" in report.stdout, report.stderr

    # The child starts at the parent's step 10: loaded from there, metrics from step 11.
    [loaded] = ledger_of(child, CheckpointLoaded)
    assert loaded.step == 10 and loaded.path == str(step_10)
    rows = losses(child)
    assert min(rows) == 11 and max(rows) == 15  # paused at 15
    # The loss continues from the parent's level (step 11 before the injected NaN), not step 1's.
    assert abs(rows[11]["loss"] - parent_rows[11]["loss"]) < 0.05 * parent_rows[11]["loss"]
    assert rows[11]["loss"] < parent_rows[1]["loss"] - 0.5
    # The new peak lr is in effect from the first step: the schedule at update 11 with peak 5e-4.
    cfg = yaml.safe_load((child / "config.yaml").read_text())
    o = cfg["optim"]
    for step in (11, 12, 15):
        want = lr_at(step - 1, 5e-4, o["min_lr"], o["warmup_steps"], 20)
        assert math.isclose(rows[step]["lr"], want, rel_tol=1e-6), (step, rows[step]["lr"], want)
    assert math.isclose(parent_rows[11]["lr"], lr_at(10, 1e-3, 1e-4, o["warmup_steps"], 40))

    # The parent is untouched (its step_10 files byte for byte) and its step 10 is pinned.
    assert checksums(step_10) == before
    assert (parent / "checkpoints" / "pins" / f"step_10.{child.name}").exists()
    assert not (parent / "checkpoints" / "step_10_universal").exists()

    # The same branch command again resumes the branch from its own checkpoint (no new run).
    again = run_cli(BASE[1:] + branch[:2] + [f"resume_from={parent}:step_10"], cwd=workdir)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(run_dirs(workdir / "runs")) == 2
    assert len(ledger_of(child, Branched)) == 1
    assert ledger_of(child, CheckpointLoaded)[-1].path == str(child / "checkpoints" / "step_15")
    assert not (parent / "checkpoints" / "pins" / f"step_10.{child.name}").exists()  # released
    assert ledger_of(child, Finished)
    rows = losses(child)
    assert sorted(rows) == list(range(11, 21))
    assert all(math.isfinite(r["loss"]) for r in rows.values())
    assert checksums(step_10) == before


def test_branch_skips_data_and_refuses_a_bad_parent(workdir):
    parent_done = run_cli(["train.max_steps=10", "checkpoint.interval_steps=5"], cwd=workdir)
    assert parent_done.returncode == 0, parent_done.stdout + parent_done.stderr
    [parent] = run_dirs(workdir / "runs")

    # Refusals: one line naming the key; nothing written.
    shape = run_cli([f"resume_from={parent}", "model.num_layers=3"], cwd=workdir)
    assert shape.returncode == 2 and "model.num_layers (2 there, 3 here)" in shape.stderr, (
        shape.stdout + shape.stderr
    )
    missing = run_cli([f"resume_from={parent}:step_7", "train.max_steps=20"], cwd=workdir)
    assert missing.returncode == 2 and "step_7: no such checkpoint" in missing.stderr
    assert "step_10, step_5" in missing.stderr
    short = run_cli([f"resume_from={parent}:step_10", "train.max_steps=10"], cwd=workdir)
    assert short.returncode == 2 and "train.max_steps=10" in short.stderr
    assert len(run_dirs(workdir / "runs")) == 1

    # By run name, newest valid checkpoint, skipping 64 samples past the parent's position; a
    # divergence before the branch's first save rolls back to the branch point (the parent's).
    step_10 = parent / "checkpoints" / "step_10"
    before = checksums(step_10)
    skip = ["resume_from=opt_tiny", "train.max_steps=14", "data.skip_samples=64"]  # name: model
    skip.append("faults.allow_inject=true")
    done = run_cli(skip, cwd=workdir, env={"SLURMTRAIN_INJECT": "nan_at_step=12"})
    assert done.returncode == 0, done.stdout + done.stderr
    [child] = [p for p in run_dirs(workdir / "runs") if p != parent]
    [loaded] = ledger_of(child, CheckpointLoaded)
    assert loaded.step == 10 and loaded.skipped_samples == 64
    [rollback] = ledger_of(child, Rollback)
    assert rollback.to_step == 10 and rollback.path == str(step_10)
    assert rollback.data_skip == 64 + rollback.skipped_samples
    assert ledger_of(child, Finished)
    manifest = json.loads((child / "checkpoints" / "step_14" / "manifest.json").read_text())
    assert manifest["data_position"]["skipped_samples"] == rollback.data_skip  # carried on
    [branched] = ledger_of(child, Branched)
    assert branched.changed["data.skip_samples"] == [0, 64]
    assert checksums(step_10) == before
