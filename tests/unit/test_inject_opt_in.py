"""SLURMTRAIN_INJECT (fault injection) needs `faults.allow_inject=true` on the command: refused at
submit without it, never inherited by a production job or its resubmissions."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

from slurmtrain.common import schema
from slurmtrain.common.rundir import locate
from slurmtrain.compute.faults.inject import Injector
from slurmtrain.login import slurm_submit
from slurmtrain.login.prepare import resolve
from tests.conftest import run_cli

schema.register()
INJECT = {"SLURMTRAIN_INJECT": "crash_at_step=3"}


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=slurm", f"runs_root={tmp_path}", *overrides])
    return resolve(cfg)


def test_inject_without_opt_in_is_refused_at_submit_in_one_line(tmp_path):
    done = run_cli(["cluster=local", "dry_run=true"], cwd=tmp_path, env=INJECT)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if "SLURMTRAIN_INJECT" in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "faults.allow_inject=true" in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()  # nothing written, nothing queued


def test_inject_with_opt_in_is_accepted(tmp_path):
    done = run_cli(
        ["cluster=local", "dry_run=true", "faults.allow_inject=true"], cwd=tmp_path, env=INJECT
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_job_script_unsets_inject_unless_the_run_opted_in(tmp_path):
    cfg = _cfg(tmp_path)
    script = slurm_submit.render_sbatch(cfg, locate(cfg))
    body = script.split("\n    srun ")[0]
    assert "unset SLURMTRAIN_INJECT" in body  # before the step and the supervisor's resubmissions
    opted = _cfg(tmp_path, "faults.allow_inject=true")
    assert "unset SLURMTRAIN_INJECT" not in slurm_submit.render_sbatch(opted, locate(opted))


def test_injector_ignores_the_variable_unless_the_run_opted_in():
    assert Injector(0, INJECT, allowed=False).get("crash_at_step") is None
    assert Injector(0, INJECT, allowed=True).get("crash_at_step") == "3"
