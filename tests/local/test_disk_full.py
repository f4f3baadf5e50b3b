"""A full disk while saving: real ENOSPC on a small tmpfs under `checkpoints/` (root only).

Earlier checkpoints and `latest` stay intact, the `.tmp` directory goes, the ledger says
`checkpoint_failed`, and training goes on (every later save retries) or stops on every rank
(`checkpoint.on_save_error=stop`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from slurmtrain.common import checkpoint_format, rundir
from slurmtrain.common.events import (
    CheckpointFailed,
    CheckpointLoaded,
    CheckpointSaved,
    Failed,
    Finished,
)
from tests.conftest import dry_run_file, ledger_of, read_jsonl, run_cli

BASE = ["train.max_steps=40", "train.log_interval=1", "checkpoint.interval_steps=10"]


def losses_by_step(run: Path) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in read_jsonl(run / "metrics.jsonl")}


def _run_dir(args: list[str], cwd: Path) -> Path:
    """Where the CLI will train this config: from the resolved config its dry run writes."""
    dry = run_cli(args + ["dry_run=true"], cwd=cwd)
    assert dry.returncode == 0, dry.stderr
    cfg = OmegaConf.create(yaml.safe_load(dry_run_file(dry.stdout).read_text()))
    return Path(cfg.runs_root) / cfg.name / rundir.fingerprint(cfg)


@pytest.fixture
def small_disk():
    """mount(path, size): a tmpfs of that size at path, unmounted afterwards."""
    mounted: list[Path] = []

    def mount(path: Path, size: str, remount: bool = False) -> None:
        path.mkdir(parents=True, exist_ok=True)
        # mode: a tmpfs root is 1777, a run directory others can write into, refused (issue 37)
        opts = f"remount,size={size}" if remount else f"size={size},mode=0700"
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        if not remount:
            mounted.append(path)

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


def _worker_log(run: Path) -> str:
    return "".join(p.read_text() for p in (run / "logs").rglob("*_0.err"))


def test_disk_full_fails_the_save_keeps_earlier_checkpoints_and_training_goes_on(
    workdir, small_disk
):
    run = _run_dir(BASE, workdir)
    small_disk(run / "checkpoints", "3M")  # one 2.0 MB checkpoint fits, a second one does not
    first = run_cli(BASE, cwd=workdir)
    assert first.returncode != 0  # its final state is not on disk: not finished
    assert [e.step for e in ledger_of(run, CheckpointSaved)] == [10]
    failed = ledger_of(run, CheckpointFailed)
    assert [e.step for e in failed] == [20, 30, 40]  # every later save retried
    assert all("No space left on device" in e.error for e in failed)
    [crash] = ledger_of(run, Failed)
    assert "final checkpoint not saved" in crash.error and not ledger_of(run, Finished)
    assert "checkpoint step_20 NOT saved" in _worker_log(run)
    checkpoints = run / "checkpoints"
    assert (checkpoints / "latest").read_text() == "step_10"
    assert checkpoint_format.validate(checkpoints / "step_10") is None
    assert not list(checkpoints.glob("step_*.tmp"))
    first_losses = losses_by_step(run)
    assert max(first_losses) == 40  # training went on after the failed saves

    small_disk(run / "checkpoints", "64M", remount=True)  # space freed: the rerun resumes
    second = run_cli(BASE, cwd=workdir)
    assert second.returncode == 0, second.stdout + second.stderr
    assert [e.step for e in ledger_of(run, CheckpointLoaded)] == [10]
    assert ledger_of(run, Finished)
    # bitwise what the first attempt computed after its failed saves: nothing was disturbed
    assert losses_by_step(run) == first_losses


def test_disk_full_with_on_save_error_stop_stops_all_ranks_cleanly(workdir, small_disk):
    args = BASE + ["checkpoint.async_save=true", "checkpoint.on_save_error=stop"]
    run = _run_dir(args, workdir)
    small_disk(run / "checkpoints", "3M")
    done = run_cli(args, cwd=workdir)
    assert done.returncode != 0
    assert [e.step for e in ledger_of(run, CheckpointSaved)] == [10]
    assert [e.step for e in ledger_of(run, CheckpointFailed)] == [20]
    [stop] = [e for e in ledger_of(run, Failed) if (e.rank or 0) == 0]  # each rank records
    assert "SaveFailed" in stop.error and "on_save_error=stop" in stop.error
    # async: the ranks learn of step 20's failure at the next save, and stop there
    assert max(losses_by_step(run)) == 30
    assert (run / "checkpoints" / "latest").read_text() == "step_10"
    assert not list((run / "checkpoints").glob("step_*.tmp"))
