"""cluster=slurm with secrets in cluster.env: the submitted script, the run
directory and the command's output carry no value; the ranks srun starts still have them (the
batch script sources the run's 0600 secrets.env)."""

from __future__ import annotations

import json
import stat
import subprocess
import time

import pytest

from slurmtrain.common.events import Failed, Finished, Submitted
from tests.cluster.helpers import events, only_run, wait_event, wait_job_gone
from tests.conftest import run_cli

pytestmark = pytest.mark.slurm
WANDB_KEY = "fedcba9876543210fedcba9876543210fedcba98"
HF_TOKEN = "hf_" + "Z9y8X7w6V5u4T3s2R1q0" * 2
DB_PASSWORD = "plain-words-nobody-guesses-42"  # looks like nothing: a secret by its name only


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
        "cluster.secrets=[ST_DB_PASSWORD]",  # by name: the value is this shell's (issue 35)
        "+cluster.env.NCCL_SOCKET_IFNAME=lo",  # configuration: in job.sbatch
    ]
    shell = {"ST_DB_PASSWORD": DB_PASSWORD}
    dry = run_cli([*args, "dry_run=true"], cwd=workdir, env=shell)
    done = run_cli(args, cwd=workdir, env=shell)
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run(workdir / "runs", "secrets")
    seen_in_ps: list[str] = []
    while not any(isinstance(e, Finished) for e in events(run)):  # no process shows it
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        seen_in_ps += [line for line in ps.splitlines() if DB_PASSWORD in line]
        assert not any(isinstance(e, Failed) for e in events(run))
        time.sleep(0.5)
    assert not seen_in_ps, seen_in_ps
    wait_event(run, Finished, timeout=600)
    [submitted] = [e for e in events(run) if isinstance(e, Submitted)]
    wait_job_gone(submitted.job_id)
    for out in (dry, done):
        for value in (WANDB_KEY, HF_TOKEN, DB_PASSWORD):
            assert value not in out.stdout + out.stderr
    # Everything under the run: config, overrides, provenance, ledger, logs, job.sbatch and the
    # script submitit queued (logs/submitit), but the 0600 file the script sources.
    leaks = [
        f"{p}: {s}"
        for p in run.rglob("*")
        if p.is_file() and p.name != "secrets.env"
        for s in (WANDB_KEY, HF_TOKEN, DB_PASSWORD)
        if s.encode() in p.read_bytes()
    ]
    assert not leaks, leaks
    assert f". {run}/secrets.env || {{" in (run / "job.sbatch").read_text()
    assert stat.S_IMODE((run / "secrets.env").stat().st_mode) == 0o600
    seen = json.loads((run / "provenance" / "attempt_1.json").read_text())["env"]
    assert seen.get("WANDB_API_KEY") == "<redacted>" and seen.get("HF_TOKEN") == "<redacted>"
    assert DB_PASSWORD in (run / "secrets.env").read_text()  # the ranks got it from there
    assert 'export NCCL_SOCKET_IFNAME="lo"' in (run / "job.sbatch").read_text()
    assert seen.get("NCCL_SOCKET_IFNAME") == "lo"
