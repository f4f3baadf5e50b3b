"""A real local run with secrets in cluster.env: no file of the run directory
but the 0600 secrets.env holds a value, nor the command's output; the training process still has
the variables."""

from __future__ import annotations

import json
import stat

from tests.conftest import run_cli, run_dirs

WANDB_KEY = "0123456789abcdef0123456789abcdef01234567"  # wandb's keys: 40 hex digits
HF_TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
URL = "https://me:pw-in-url@wandb.example"
SECRETS = (WANDB_KEY, HF_TOKEN, URL)


def test_secrets_reach_the_job_and_no_record(workdir, monkeypatch):
    for name in (
        "WANDB_API_KEY",
        "HF_TOKEN",
        "WANDB_BASE_URL",
    ):  # only cluster.env can give the job these
        monkeypatch.delenv(name, raising=False)
    args = [
        "cluster=local",
        "train.max_steps=2",
        "checkpoint.interval_steps=2",
        f"+cluster.env.WANDB_API_KEY={WANDB_KEY}",
        f"+cluster.env.HF_TOKEN={HF_TOKEN}",
        f"+cluster.env.WANDB_BASE_URL={URL}",  # neither name nor value looks secret
    ]
    env = {"SLURMTRAIN_RUNS_ROOT": str(workdir / "runs")}
    dry = run_cli([*args, "dry_run=true"], cwd=workdir, env=env)
    done = run_cli(args, cwd=workdir, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    for out in (dry, done):
        for secret in SECRETS:
            assert secret not in out.stdout + out.stderr
    [run] = run_dirs(workdir / "runs")
    leaks = []
    for path in (p for p in run.rglob("*") if p.is_file()):
        if path.name == "secrets.env":
            continue
        data = path.read_bytes()
        leaks += [f"{path}: {s}" for s in SECRETS if s.encode() in data]
    assert not leaks, leaks
    secrets_env = run / "secrets.env"
    assert stat.S_IMODE(secrets_env.stat().st_mode) == 0o600
    assert WANDB_KEY in secrets_env.read_text() and HF_TOKEN in secrets_env.read_text()
    assert "${oc.env:WANDB_API_KEY}" in (run / "config.yaml").read_text()
    assert stat.S_IMODE(run.stat().st_mode) == 0o700  # run_dir_mode default (issue 37)
    for name in ("config.yaml", "overrides.yaml", "provenance/submit_1.json"):
        assert not stat.S_IMODE((run / name).stat().st_mode) & 0o007, name
    # Rank 0 recorded its environment (names; these values redacted): it had both variables,
    # which the test's own environment did not.
    seen = json.loads((run / "provenance" / "attempt_1.json").read_text())["env"]
    for name in ("WANDB_API_KEY", "HF_TOKEN", "WANDB_BASE_URL"):
        assert seen.get(name) == "<redacted>", (name, seen.get(name))
