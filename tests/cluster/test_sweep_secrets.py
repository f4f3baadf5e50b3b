"""A sweep and its dry run with a secret given by name (issue 37): its value is in no file under
the runs root (Hydra's multirun.yaml, the array's map and script, each point's run directory) or
the dry run's folder but each point's 0600 secrets.env, and in no command line slurmtrain runs
(every Slurm command goes through a recording shim first; the queued job's command and script)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.cluster.helpers import wait_job_gone
from tests.conftest import run_cli

pytestmark = pytest.mark.slurm
SECRET = "sweep-words-nobody-guesses-37"  # looks like nothing: a secret by its name only
COMMANDS = ("sbatch", "srun", "scontrol", "squeue", "sinfo", "sacct", "scancel")


def _recording_path(bin_dir: Path, log: Path) -> str:
    """PATH with a shim per Slurm command that appends its argv to `log`, then runs the real one."""
    bin_dir.mkdir()
    for name in COMMANDS:
        real = shutil.which(name)
        assert real, name
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "{name} $*" >> {log}\nexec {real} "$@"\n')
        shim.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def _holding(folder: Path) -> list[str]:
    return [
        str(p)
        for p in folder.rglob("*")
        if p.is_file() and not p.is_symlink() and SECRET.encode() in p.read_bytes()
    ]


def test_a_swept_secret_given_by_name_is_only_in_the_0600_files(slurm_cluster, workdir):
    argv_log = workdir / "argv.log"
    env = {
        "ST_SWEEP_PASSWORD": SECRET,
        "PATH": _recording_path(workdir / "shims", argv_log),
    }
    args = [
        "-m",
        "cluster=slurm",
        "name=sweepsecret",
        "train.max_steps=1",
        "cluster.secrets=[ST_SWEEP_PASSWORD]",
        "optim.lr=1e-4,3e-4",
        "+cluster.sbatch_extra.hold=true",  # queued, never started: scancel is instant
    ]
    dry = run_cli([*args, "dry_run=true"], cwd=workdir, env=env)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    [dry_folder] = re.findall(r" under\s+(\S+)", dry.stdout)
    done = run_cli(args, cwd=workdir, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    [array] = re.findall(r"submitted job array (\d+)", done.stdout)
    queued = subprocess.run(
        ["scontrol", "show", "job", array], capture_output=True, text=True
    ).stdout
    script = subprocess.run(
        ["scontrol", "write", "batch_script", array, "-"], capture_output=True, text=True
    ).stdout
    subprocess.run(["scancel", array], check=False)  # held: the records are the test
    wait_job_gone(array)

    assert "Command=" in queued and SECRET not in queued
    assert "secrets.env" in script and SECRET not in script
    for out in (dry, done):
        assert SECRET not in out.stdout + out.stderr
        assert "warning" not in out.stderr  # by name: nothing to warn about
    assert "sbatch" in argv_log.read_text() and SECRET not in argv_log.read_text()
    runs = workdir / "runs"
    record = runs / ".sweeps" / "multirun.yaml"
    assert "ST_SWEEP_PASSWORD" in record.read_text()
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    held = _holding(runs) + _holding(Path(dry_folder))
    env_files = sorted(runs.glob("sweepsecret/*/secrets.env"))
    assert len(env_files) == 2 and sorted(held) == [str(p) for p in env_files]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in env_files)
