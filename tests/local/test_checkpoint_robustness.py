"""Checkpoints survive corruption and a SIGKILL in the middle of a save (real runs).

One uninterrupted run is the reference; one async run is SIGKILLed on every rank while it writes
step 30, leaving step_10, step_20 and a partial step_30.tmp. Each test resumes a copy of that run
directory (damaged as the test says) and must end with exactly the reference's losses.
(A full disk: tests/local/test_disk_full.py.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from slurmtrain.common.events import CheckpointLoaded, CheckpointSaved, CheckpointSkipped, Finished
from tests.conftest import ledger_of, read_jsonl, run_cli, run_dirs

BASE = ["train.max_steps=40", "train.log_interval=1", "checkpoint.interval_steps=10"]
SHARD = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


def losses_by_step(run: Path) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in read_jsonl(run / "metrics.jsonl")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("reference")
    done = run_cli(BASE, cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(work / "runs")
    return run


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    """An async-saving run SIGKILLed (all ranks) after writing part of step_30.tmp."""
    work = tmp_path_factory.mktemp("killed")
    dead = run_cli(
        BASE + ["checkpoint.async_save=true", "faults.allow_inject=true"],
        cwd=work,
        env={"SLURMTRAIN_INJECT": "kill_during_save=30"},
    )
    assert dead.returncode != 0
    [run] = run_dirs(work / "runs")
    partial = run / "checkpoints" / "step_30.tmp"
    assert partial.is_dir() and any(partial.iterdir()) and not (partial / "manifest.json").exists()
    assert (run / "checkpoints" / "latest").read_text() == "step_20"
    return work


def _resume_copy(killed: Path, target: Path) -> tuple[Path, Path]:
    shutil.copytree(killed, target, symlinks=True)
    [run] = run_dirs(target / "runs")
    return run, target


def test_sigkill_during_a_save_never_loads_the_partial_checkpoint(killed, reference, tmp_path):
    run, work = _resume_copy(killed, tmp_path / "w")
    resumed = run_cli(BASE, cwd=work)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    [loaded] = ledger_of(run, CheckpointLoaded)
    assert loaded.step == 20 and loaded.path.endswith("/step_20")
    assert ledger_of(run, CheckpointSkipped) == []  # a .tmp directory is never even a candidate
    assert ledger_of(run, Finished)
    assert losses_by_step(run) == losses_by_step(reference)  # bitwise: fp32 on CPU


def test_async_saves_write_the_same_shards_as_sync_saves(killed, reference):
    [run] = run_dirs(killed / "runs")
    async_dir, sync_dir = run / "checkpoints" / "step_20", reference / "checkpoints" / "step_20"
    for name in ("mp_rank_00_model_states.pt", SHARD):
        assert (async_dir / name).read_bytes() == (sync_dir / name).read_bytes(), name
    saved = ledger_of(run, CheckpointSaved)
    assert [e.mode for e in saved] == ["async", "async"]
    assert all(0 < e.seconds <= e.total_seconds for e in saved)


def test_flipped_bytes_in_the_newest_checkpoint_fall_back_to_the_previous(
    killed, reference, tmp_path
):
    run, work = _resume_copy(killed, tmp_path / "w")
    shard = run / "checkpoints" / "step_20" / SHARD
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    resumed = run_cli(BASE, cwd=work)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    [skipped] = ledger_of(run, CheckpointSkipped)
    assert skipped.path.endswith("/step_20") and "checksum mismatch" in skipped.reason
    [loaded] = ledger_of(run, CheckpointLoaded)
    assert loaded.step == 10
    assert losses_by_step(run) == losses_by_step(reference)


def test_a_zero_byte_shard_is_skipped(killed, reference, tmp_path):
    run, work = _resume_copy(killed, tmp_path / "w")
    (run / "checkpoints" / "step_20" / SHARD).write_bytes(b"")  # metaseq's empty-shard case
    resumed = run_cli(BASE, cwd=work)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    [skipped] = ledger_of(run, CheckpointSkipped)
    assert skipped.path.endswith("/step_20") and f"{SHARD}: 0 bytes" in skipped.reason
    assert [e.step for e in ledger_of(run, CheckpointLoaded)] == [10]
    assert losses_by_step(run) == losses_by_step(reference)
