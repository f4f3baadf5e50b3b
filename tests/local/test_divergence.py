"""Divergence: a non-finite loss rolls back in-process and skips the data window;
a divergence that comes back stops the run `diverged`; nothing non-finite is ever published."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import torch

from slurmtrain.common.events import FailureClass, Finished, Rollback, Started, Stopped
from tests.conftest import (
    PYTHON,
    ledger_of,
    read_jsonl,
    run_cli,
    run_dirs,
    slurmtrain_env,
)

BASE = ["train.max_steps=40", "train.log_interval=1", "checkpoint.interval_steps=10"]


def manifests(run: Path) -> dict[str, dict]:
    return {
        p.parent.name: json.loads(p.read_text())
        for p in (run / "checkpoints").glob("step_*/manifest.json")
    }


def supervise_rc(run: Path) -> int:
    """What the batch-shell supervisor would do after this attempt (it reads only the ledger)."""
    [started, *_] = ledger_of(run, Started)
    env = slurmtrain_env({"SLURM_JOB_ID": str(started.job_id)})
    done = subprocess.run(
        [PYTHON, "-m", "slurmtrain.batch.supervise", str(run), "--rc", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode


def test_nan_loss_rolls_back_skips_the_window_and_finishes_finite(workdir):
    done = run_cli(
        [*BASE, "faults.allow_inject=true"],
        cwd=workdir,
        env={"SLURMTRAIN_INJECT": "nan_at_step=15"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(workdir / "runs")
    [rollback] = ledger_of(run, Rollback)
    assert rollback.step == 15 and math.isnan(rollback.loss) and rollback.to_step == 10
    assert rollback.skipped_samples > 0 and rollback.data_skip == rollback.skipped_samples
    assert ledger_of(run, Finished) and not ledger_of(run, Stopped)
    losses = {row["step"]: row["loss"] for row in read_jsonl(run / "metrics.jsonl")}
    assert sorted(losses) == list(range(1, 41)) and all(math.isfinite(v) for v in losses.values())
    found = manifests(run)
    assert found and all(math.isfinite(m["loss"]) for m in found.values())
    # Checkpoints after the rollback carry the skip, so a resume draws the same batches.
    assert found["step_40"]["data_position"]["skipped_samples"] == rollback.data_skip


def test_divergence_that_comes_back_stops_diverged_and_publishes_nothing_non_finite(workdir):
    inject = {"SLURMTRAIN_INJECT": "nan_at_step=15,nan_repeat=1"}
    done = run_cli([*BASE, "faults.allow_inject=true"], cwd=workdir, env=inject)
    [run] = run_dirs(workdir / "runs")
    assert len(ledger_of(run, Rollback)) == 1, done.stdout + done.stderr
    [stopped] = ledger_of(run, Stopped)
    assert stopped.cls == FailureClass.diverged and "diverged again" in stopped.error
    assert not ledger_of(run, Finished)
    assert sorted(manifests(run)) == ["step_10"]  # nothing past the divergence was published
    assert supervise_rc(run) == 1  # EXIT_STOPPED: the supervisor does not restart it
    status = run_cli(["--json", str(run)], cwd=workdir, module="slurmtrain.cli.status")
    row = json.loads(status.stdout)
    assert row["state"] == "stopped: diverged" and row["rollbacks"] == 1


def test_lr_1e30_stops_diverged_with_no_checkpoint_published(workdir):
    """The finding: lr=1e30 trained to the end with loss NaN and published NaN checkpoints."""
    done = run_cli(BASE + ["optim.lr=1e30", "checkpoint.interval_steps=1"], cwd=workdir)
    [run] = run_dirs(workdir / "runs")
    [stopped] = ledger_of(run, Stopped)
    assert stopped.cls == FailureClass.diverged, done.stdout + done.stderr
    assert not ledger_of(run, Finished)
    first_nan = min(e.step for e in ledger_of(run, Rollback)) if ledger_of(run, Rollback) else 2
    for name, manifest in manifests(run).items():  # every published checkpoint is finite
        assert math.isfinite(manifest["loss"]) and manifest["step"] < first_nan, name
        # ZeRO-2: the weights live in each rank's fp32 partition (the module file holds none)
        shards = sorted((run / "checkpoints" / name).glob("zero_pp_rank_*_optim_states.pt"))
        assert shards, name
        for shard in shards:
            state = torch.load(shard, weights_only=False)["optimizer_state_dict"]
            fp32 = state["single_partition_of_fp32_groups"]
            assert fp32 and all(torch.isfinite(t).all() for t in fp32), (name, shard.name)
