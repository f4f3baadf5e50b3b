"""cluster=slurm with secrets in cluster.env: the submitted script, the run
directory and the command's output carry no value; the ranks srun starts still have them (the
batch script sources the run's 0600 secrets.env)."""

from __future__ import annotations

import json
import stat

import pytest

from tests.cluster.helpers import events, only_run, wait_event, wait_job_gone
from tests.conftest import run_cli

pytestmark = pytest.mark.slurm
WANDB_KEY = "fedcba9876543210fedcba9876543210fedcba98"
HF_TOKEN = "hf_" + "Z9y8X7w6V5u4T3s2R1q0" * 2


def test_secret_reaches_every_rank_and_no_record(slurm_cluster, workdir, monkeypatch):
    for name in ("WANDB_API_KEY", "HF_TOKEN"):  # sbatch exports our environment: not from here
        monkeypatch.delenv(name, raising=False)
    args = [
        "cluster=slurm",
        "name=secrets",
        "train.max_steps=2",
        "checkpoint.interval_steps=2",
        f"+cluster.env.WANDB_API_KEY={WANDB_KEY}",
        f"+cluster.env.HF_TOKEN={HF_TOKEN}",
    ]
    dry = run_cli([*args, "dry_run=true"], cwd=workdir)
    done = run_cli(args, cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run(workdir / "runs", "secrets")
    wait_event(run, "finished", timeout=600)
    [submitted] = [e for e in events(run) if e["event"] == "submitted"]
    wait_job_gone(submitted["job_id"])
    for out in (dry, done):
        assert WANDB_KEY not in out.stdout + out.stderr and HF_TOKEN not in out.stdout + out.stderr
    # Everything under the run: config, overrides, provenance, ledger, logs, job.sbatch and the
    # script submitit queued (logs/submitit), but the 0600 file the script sources.
    leaks = [
        f"{p}: {s}"
        for p in run.rglob("*")
        if p.is_file() and p.name != "secrets.env"
        for s in (WANDB_KEY, HF_TOKEN)
        if s.encode() in p.read_bytes()
    ]
    assert not leaks, leaks
    assert f". {run}/secrets.env || {{" in (run / "job.sbatch").read_text()
    assert stat.S_IMODE((run / "secrets.env").stat().st_mode) == 0o600
    seen = json.loads((run / "provenance" / "attempt_1.json").read_text())["env"]
    assert seen.get("WANDB_API_KEY") == "<redacted>" and seen.get("HF_TOKEN") == "<redacted>"
