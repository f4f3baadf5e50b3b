"""Slurm commands retry transient errors with backoff, never definite ones, and sbatch never twice.

The fakes on PATH stand for the network failing (a controller that does not answer for a while),
not for Slurm's behaviour: each prints the error text real Slurm clients print, then answers.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from slurmtrain.common import slurm_cmd
from slurmtrain.common.slurm_text import SlurmError

SOCKET = "slurm_load_jobs error: Socket timed out on send/recv operation"
NO_CTLD = "scontrol: error: Unable to contact slurm controller (connect failure)"

FAKE = r"""#!/bin/bash
me=$(basename "$0")
n=$(cat "$FAKE_DIR/$me.n" 2>/dev/null || echo 0); echo $((n+1)) > "$FAKE_DIR/$me.n"
printf '%s\n' "$*" >> "$FAKE_DIR/$me.calls"
fails_var="FAKE_FAILS_${me}"; fails=${!fails_var:-0}
err_var="FAKE_ERR_${me}"; err=${!err_var:-"Socket timed out on send/recv operation"}
if [ "$me" = sbatch ]; then
  comment=""; for a in "$@"; do case "$a" in --comment=*) comment="${a#--comment=}";; esac; done
  if [ "$n" -lt "$fails" ]; then
    if [ -n "$FAKE_QUEUED_BEFORE_ERROR" ]; then echo "$((100+n))|$comment" >> "$FAKE_DIR/jobs"; fi
    echo "sbatch: error: Batch job submission failed: $err" >&2; exit 1
  fi
  echo "$((100+n))|$comment" >> "$FAKE_DIR/jobs"; echo "$((100+n))"; exit 0
fi
if [ "$n" -lt "$fails" ]; then echo "$me: error: $err" >&2; exit 1; fi
if [ "$me" = squeue ]; then cat "$FAKE_DIR/jobs" 2>/dev/null; exit 0; fi
echo "JobId=5 JobState=RUNNING Restarts=0"
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "sbatch", "squeue"):
        exe = bin_dir / name
        exe.write_text(FAKE)
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    monkeypatch.setattr(slurm_cmd, "FIRST_DELAY_S", 0.05)
    monkeypatch.setattr(slurm_cmd, "MAX_DELAY_S", 0.2)
    return tmp_path


def calls(fake: Path, name: str) -> list[str]:
    path = fake / f"{name}.calls"
    return path.read_text().splitlines() if path.exists() else []


def jobs(fake: Path) -> list[str]:
    path = fake / "jobs"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize(
    "error",
    [
        SOCKET,
        NO_CTLD,
        "Transport endpoint is not connected",
        "Connection refused",
        "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
    ],
)
def test_transient_errors_are_retried_until_the_controller_answers(fake, monkeypatch, error):
    monkeypatch.setenv("FAKE_FAILS_scontrol", "3")
    monkeypatch.setenv("FAKE_ERR_scontrol", error)
    t0 = time.monotonic()
    info = slurm_cmd.job_info("5")
    assert info["JobState"] == "RUNNING"
    assert len(calls(fake, "scontrol")) == 4
    assert time.monotonic() - t0 >= 0.05 + 0.1 + 0.2 - 0.01  # exponential backoff, capped


@pytest.mark.parametrize("error", ["Invalid job id specified", "Invalid partition name specified"])
def test_definite_errors_are_never_retried(fake, monkeypatch, error):
    monkeypatch.setenv("FAKE_FAILS_scontrol", "5")
    monkeypatch.setenv("FAKE_ERR_scontrol", error)
    with pytest.raises(SlurmError, match=error):
        slurm_cmd.run(["scontrol", "show", "job", "5"])
    assert len(calls(fake, "scontrol")) == 1


def test_retries_stop_at_the_total_deadline(fake, monkeypatch):
    monkeypatch.setenv("FAKE_FAILS_scontrol", "1000")
    monkeypatch.setenv("FAKE_ERR_scontrol", NO_CTLD)
    t0 = time.monotonic()
    with pytest.raises(SlurmError, match="Unable to contact"):
        slurm_cmd.run(["scontrol", "ping"], retry_s=1.0)
    assert time.monotonic() - t0 < 2.0
    assert 3 <= len(calls(fake, "scontrol")) <= 10


def test_the_deadline_comes_from_the_environment(fake, monkeypatch):
    monkeypatch.setenv("FAKE_FAILS_scontrol", "1000")
    monkeypatch.setenv(slurm_cmd.RETRY_ENV, "0")
    with pytest.raises(SlurmError):
        slurm_cmd.run(["scontrol", "ping"])
    assert len(calls(fake, "scontrol")) == 1


def test_sbatch_that_queued_but_lost_its_answer_is_not_submitted_again(fake, monkeypatch):
    monkeypatch.setenv("FAKE_FAILS_sbatch", "1")
    monkeypatch.setenv("FAKE_QUEUED_BEFORE_ERROR", "1")
    job = slurm_cmd.sbatch(["--exclude=n1"], "/x/job.sbatch")
    assert job == "100"
    assert len(calls(fake, "sbatch")) == 1 and len(jobs(fake)) == 1
    assert "--exclude=n1" in calls(fake, "sbatch")[0]


def test_sbatch_that_did_not_queue_is_tried_again_once_it_can_be_checked(fake, monkeypatch):
    monkeypatch.setenv("FAKE_FAILS_sbatch", "2")
    monkeypatch.setenv("FAKE_ERR_sbatch", "Unable to contact slurm controller (connect failure)")
    monkeypatch.setenv("FAKE_FAILS_squeue", "2")  # the check itself waits for the controller
    job = slurm_cmd.sbatch([], "/x/job.sbatch")
    assert job == "102" and jobs(fake) == [f"102|{jobs(fake)[0].split('|')[1]}"]
    tokens = {c.split("--comment=")[1].split()[0] for c in calls(fake, "sbatch")}
    assert len(tokens) == 1  # the same token on every try


def test_sbatch_is_not_retried_blind_when_squeue_cannot_say(fake, monkeypatch):
    monkeypatch.setenv("FAKE_FAILS_sbatch", "1")
    monkeypatch.setenv("FAKE_QUEUED_BEFORE_ERROR", "1")
    monkeypatch.setenv("FAKE_FAILS_squeue", "1000")
    with pytest.raises(SlurmError, match="not submitted again"):
        slurm_cmd.sbatch([], "/x/job.sbatch", retry_s=0.5)
    assert len(calls(fake, "sbatch")) == 1


def test_sbatch_definite_refusal_is_not_retried(fake, monkeypatch):
    monkeypatch.setenv("FAKE_FAILS_sbatch", "3")
    monkeypatch.setenv("FAKE_ERR_sbatch", "Invalid partition name specified")
    with pytest.raises(SlurmError, match="Invalid partition"):
        slurm_cmd.sbatch([], "/x/job.sbatch")
    assert len(calls(fake, "sbatch")) == 1


def test_plain_run_never_retries_a_submission(fake, monkeypatch):
    monkeypatch.setenv("FAKE_FAILS_sbatch", "1")
    monkeypatch.setenv("FAKE_QUEUED_BEFORE_ERROR", "1")
    with pytest.raises(SlurmError):
        slurm_cmd.run(["sbatch", "--parsable", "/x/job.sbatch"])
    assert len(calls(fake, "sbatch")) == 1
