"""checkpoint.dir (issue 35, build 4): checkpoints on another path while the run directory keeps
config, ledger and logs. One run on 2 CPU ranks saves every 2 steps keeping 2, is killed at step 7,
resumes from the other path, purges there, and exports from there; the run directory's own
`checkpoints` is only the link."""

from __future__ import annotations

import json
import os

from slurmtrain.common.events import CheckpointLoaded, CheckpointSaved
from tests.conftest import ledger_events, run_cli, run_dirs

ARGS = [
    "train.max_steps=8",
    "train.log_interval=1",
    "checkpoint.interval_steps=2",
    "checkpoint.keep_last=2",
    "checkpoint.keep_every=0",
    "train.global_batch_size=4",
    "train.micro_batch_size=2",
]


def test_checkpoints_live_on_checkpoint_dir_and_everything_follows(workdir, tmp_path):
    scratch = tmp_path / "scratch"
    args = [*ARGS, "name=elsewhere", f"checkpoint.dir={scratch}"]
    dry = run_cli([*args, "dry_run=true"], cwd=workdir)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    crashed = run_cli(
        [*args, "faults.allow_inject=true"],
        cwd=workdir,
        env={"SLURMTRAIN_INJECT": "crash_at_step=7"},
    )
    assert crashed.returncode != 0
    elsewhere = [*args[:-1], f"checkpoint.dir={tmp_path / 'other'}"]
    moved = run_cli(elsewhere, cwd=workdir)  # checkpoints are never moved behind the user's back
    assert moved.returncode == 2 and "checkpoint.dir=" in moved.stderr, moved.stdout + moved.stderr
    assert len([x for x in moved.stderr.splitlines() if "error" in x]) == 1, moved.stderr
    resumed = run_cli(args, cwd=workdir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    [run] = run_dirs(workdir / "runs")
    link = run / "checkpoints"
    where = scratch / run.parent.name / run.name
    assert link.is_symlink() and os.readlink(link) == str(where)
    [loaded] = [e for e in ledger_events(run) if isinstance(e, CheckpointLoaded)]
    assert loaded.step == 6
    saved = [e.step for e in ledger_events(run) if isinstance(e, CheckpointSaved)]
    assert saved[-1] == 8
    kept = sorted(p.name for p in where.iterdir() if p.name.startswith("step_"))
    assert kept == ["step_6", "step_8"], kept  # purged on checkpoint.dir (keep_last=2)
    assert (where / "latest").read_text().strip() == "step_8"
    assert not [p for p in run.iterdir() if p.name.startswith("step_")]

    out = tmp_path / "hf"
    export = run_cli(["export", str(run), "--out", str(out), "--no-verify"], cwd=workdir)
    assert export.returncode == 0, export.stdout + export.stderr
    assert json.loads((out / "config.json").read_text())["model_type"]
    status = run_cli(["status", str(run)], cwd=workdir)
    assert status.returncode == 0 and "step_8" in status.stdout, status.stdout + status.stderr
