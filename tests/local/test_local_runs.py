"""The embedded default end to end on this machine: train, finish, refuse to redo, survive SIGKILL."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from pathlib import Path

from slurmtrain.common.events import CheckpointLoaded, Finished, Started, Startup, Submitted
from tests.conftest import PYTHON, ledger_events, read_jsonl, run_cli, run_dirs, slurmtrain_env

FAST = ["train.max_steps=40", "train.log_interval=1", "checkpoint.interval_steps=10"]


def losses_by_step(run: Path) -> dict[int, float]:
    """The loss of each step as finally computed (a later attempt's row replaces an earlier one)."""
    return {row["step"]: row["loss"] for row in read_jsonl(run / "metrics.jsonl")}


def test_default_run_finishes_with_falling_loss_and_a_rerun_trains_nothing(workdir):
    done = run_cli(FAST, cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(workdir / "runs")
    kinds = [type(e) for e in ledger_events(run)]
    assert kinds[0] is Submitted and kinds[-1] is Finished
    losses = losses_by_step(run)
    assert sorted(losses) == list(range(1, 41))
    assert sum(losses[s] for s in range(36, 41)) < 0.85 * sum(losses[s] for s in range(1, 6))
    assert (run / "checkpoints" / "latest").read_text() == "step_40"
    for name in (
        "config.yaml",
        "overrides.yaml",
        "provenance/submit_1.json",
        "provenance/attempt_1.json",
        "provenance/attempt_1.pip-freeze.txt",
    ):
        assert (run / name).is_file(), name

    again = run_cli(FAST, cwd=workdir)
    assert again.returncode == 0
    assert "already finished" in again.stdout and str(run) in again.stdout
    assert [type(e) for e in ledger_events(run)] == kinds


def _wait_for_step(metrics: Path, step: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        if metrics.exists() and any(r["step"] >= step for r in read_jsonl(metrics)):
            return
        time.sleep(0.1)
    raise AssertionError(f"never reached step {step}")


def test_sigkill_mid_run_then_rerun_resumes_bitwise(workdir):
    """In bf16 under ZeRO-2, the GPU runs' precision path (fp32 gradient accumulation and
    reduction, DeepSpeed's overflow check left to the loop's guard), on this machine's CPUs. The
    fp32 default resumes bitwise in test_sharded_module.py and, requeued, on the cluster."""
    args = [*FAST, "deepspeed.dtype=bf16"]
    reference = run_cli(args + ["name=reference"], cwd=workdir)
    assert reference.returncode == 0, reference.stderr
    [ref_run] = run_dirs(workdir / "runs")
    losses = losses_by_step(ref_run)
    assert all(math.isfinite(loss) for loss in losses.values())
    assert sum(losses[s] for s in range(36, 41)) < 0.85 * sum(losses[s] for s in range(1, 6))

    env = slurmtrain_env({"SLURMTRAIN_INJECT": "step_delay=0.15"})
    proc = subprocess.Popen(
        [PYTHON, "-m", "slurmtrain", *args, "name=killed", "faults.allow_inject=true"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run = workdir / "runs" / "killed" / ref_run.name  # same config: same fingerprint
    _wait_for_step(run / "metrics.jsonl", 25, proc)
    [started] = [e for e in ledger_events(run) if isinstance(e, Started)]
    for pid in started.pids:
        os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert not any(isinstance(e, Finished) for e in ledger_events(run))

    resumed = run_cli(args + ["name=killed"], cwd=workdir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming" in resumed.stdout
    ledger = ledger_events(run)
    [loaded] = [e for e in ledger if isinstance(e, CheckpointLoaded)]
    assert loaded.attempt == 2 and loaded.step in (20, 30)
    assert isinstance(ledger[-1], Finished)
    assert losses_by_step(run) == losses  # bitwise: bf16 on CPU
    # ... though the resume built the model without initialising it (the load overwrites it)
    startups = {e.attempt: e for e in ledger if isinstance(e, Startup)}
    assert startups[2].build_skipped_init is True and startups[2].phases["load"] > 0
