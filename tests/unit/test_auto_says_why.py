"""Issue #36, Build 4 "Auto says why": when `cluster=auto` picks this machine, the plan and any
refusal say why in one line (no sbatch on PATH, or the controller not answering) and how to force
Slurm (cluster=slurm).

Finding reproduced (before this change): `model=opt13b nodes=64 gpus_per_node=8 dry_run=true` in a
shell without sbatch planned as local and was refused with "nodes=64: the local executor runs on
this machine only; use nodes=1 or cluster=slurm": nothing said auto-detection chose local, or why."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from slurmtrain.common import slurm_cmd
from slurmtrain.common.slurm_text import SlurmError
from slurmtrain.login import dry_run, placement
from tests.conftest import run_cli
from tests.plans import planned

BIG = ("model=opt13b", "nodes=64", "gpus_per_node=8", "dry_run=true")
WHY_PATH = "no sbatch on PATH; cluster=slurm forces Slurm"


@pytest.fixture
def detect(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Auto-detection on (tests default to SLURMTRAIN_AUTO=off), PATH an empty folder: no sbatch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("SLURMTRAIN_AUTO", "")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(placement, "_probe_cache", {})
    monkeypatch.setattr(placement, "_said", set())
    monkeypatch.setattr(placement, "_pending", [])
    monkeypatch.setattr(placement, "_chose_local", {"why": None})
    return bin_dir


def test_dry_run_without_sbatch_says_why_in_the_plan_and_the_refusal(detect, tmp_path, capsys):
    cfg = planned(tmp_path, *BIG)
    assert cfg.cluster.kind == "local"
    out = io.StringIO()
    assert dry_run.show(cfg, out) == 2
    plan = [ln for ln in out.getvalue().splitlines() if ln.startswith("plan: executor")]
    assert plan == [f"plan: executor local, this machine (cluster=auto: {WHY_PATH})"]
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("slurmtrain: error")]
    assert err == [
        "slurmtrain: error: nodes=64: the local executor runs on this machine only; use nodes=1 "
        f"or cluster=slurm (cluster=auto chose local: {WHY_PATH})"
    ]


def test_a_controller_that_does_not_answer_is_the_reason(detect, tmp_path, monkeypatch) -> None:
    sbatch = detect / "sbatch"
    sbatch.write_text("#!/bin/sh\nexit 1\n")
    sbatch.chmod(0o755)

    def down(*args: object, **kwargs: object) -> str:
        raise SlurmError("Unable to contact slurm controller")

    monkeypatch.setattr(slurm_cmd, "run", down)
    cfg = planned(tmp_path, "nodes=1")
    assert cfg.cluster.kind == "local"
    line = placement.plan_line(cfg)
    assert line is not None and "sbatch is on PATH but the controller does not answer" in line
    assert "Unable to contact slurm controller" in line and "cluster=slurm forces Slurm" in line


def test_nothing_is_said_where_auto_did_not_choose_local(detect, tmp_path, monkeypatch) -> None:
    assert placement.plan_line(planned(tmp_path, "cluster=local")) is None
    assert placement.with_why("nodes=64: ...") == "nodes=64: ..."
    monkeypatch.setenv("SLURMTRAIN_AUTO", "off")  # said by the auto line itself: not a probe
    assert placement.plan_line(planned(tmp_path)) is None


def test_a_real_submission_refused_says_why(tmp_path) -> None:
    """The refusal before any plan is printed (validation of the submission) through
    `python -m slurmtrain`, in a shell whose PATH has no sbatch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {"SLURMTRAIN_AUTO": "", "PATH": str(bin_dir), "SLURMTRAIN_RUNS_ROOT": str(tmp_path)}
    done = run_cli(list(BIG[:-1]), tmp_path, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(f"(cluster=auto chose local: {WHY_PATH})")
    assert not list(tmp_path.glob("*/*/config.yaml"))  # refused: nothing written
