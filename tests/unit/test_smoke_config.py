"""smoke=true: the smoke run's config, the flags of a dependent job, the supervisor's exit code."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.batch import supervise
from slurmtrain.common import derived, events, ledger, schema
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.rundir import create, fingerprint, locate
from slurmtrain.compute.faults.inject import Injector
from slurmtrain.login import slurm_submit
from slurmtrain.login.prepare import resolve
from slurmtrain.login.smoke import blocked, smoke_config, smoke_overrides

schema.register()


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=slurm", f"runs_root={tmp_path}", *overrides])
    return resolve(cfg)


def test_smoke_is_one_node_two_layers_twenty_steps_with_a_save_and_no_retries(tmp_path):
    big = _cfg(
        tmp_path,
        "model=opt125m",
        "nodes=4",
        "train.max_steps=5000",
        "name=big",
        "train.grad_accumulation=2",
        "smoke=true",
        "train.global_batch_tokens=null",
    )  # batch from micro x accumulation x world
    small = smoke_config(big)
    assert (small.name, small.nodes, small.model.num_layers) == ("big-smoke", 1, 2)
    assert (small.train.max_steps, small.train.pause_at_step) == (20, 10)
    assert small.checkpoint.interval_steps == 10 and not small.smoke
    assert derived.grad_accumulation(small, derived.world_size(small)) == 2  # same work per rank
    assert small.model.hidden_size == big.model.hidden_size and small.data == big.data
    assert all(small.faults[f"max_{c}"] == 0 for c in ledger.FAILURE_CLASSES if c != "preempted")
    assert fingerprint(small) != fingerprint(big)


def test_the_smoke_runs_recorded_overrides_compose_to_its_config(tmp_path):
    """overrides.yaml of the smoke run is what a hand resubmission composes: every key exists."""
    user = ["model=opt125m", "nodes=4", "train.max_steps=5000", "name=big", "smoke=true"]
    small = smoke_config(_cfg(tmp_path, *user))
    again = _cfg(tmp_path, *[o for o in smoke_overrides(user, small) if o != "smoke=true"])
    assert (again.name, again.nodes, again.model.num_layers) == ("big-smoke", 1, 2)
    assert all(again.faults[f"max_{c}"] == 0 for c in ledger.FAILURE_CLASSES if c != "preempted")


def test_smoke_flag_does_not_change_the_fingerprint_and_needs_slurm(tmp_path):
    assert fingerprint(_cfg(tmp_path, "smoke=true")) == fingerprint(_cfg(tmp_path))
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        local = compose("config", overrides=[f"runs_root={tmp_path}", "smoke=true"])
    with pytest.raises(ConfigError, match=r"smoke=true: .* cluster=slurm"):
        resolve(local)


def test_dependency_is_passed_at_submission_only(tmp_path):
    cfg = _cfg(tmp_path, "nodes=2")
    run = locate(cfg)
    script = slurm_submit.executor(cfg, tmp_path / "s", [str(run.path)], after="123")
    text = script._make_submission_file_text("true", "uid")
    assert "#SBATCH --dependency=afterok:123" in text and "--kill-on-invalid-dep=yes" in text
    plain = slurm_submit.executor(cfg, tmp_path / "s", [str(run.path)])._make_submission_file_text(
        "true", "uid"
    )
    assert "--dependency" not in plain and "--dependency" not in slurm_submit.render_sbatch(
        cfg, run
    )


def test_injection_confined_to_runs_by_name_suffix():
    env = {"SLURMTRAIN_INJECT": "crash_at_step=3,name_suffix=-smoke"}
    assert Injector(0, env, name="x-smoke", allowed=True).get("crash_at_step") == "3"
    assert Injector(0, env, name="x", allowed=True).get("crash_at_step") is None


def _run_with(tmp_path, rows):
    cfg = _cfg(tmp_path, "name=sup")
    run = locate(cfg)
    create(run, cfg, [])
    for row in rows:
        run.record(events.parse(row))  # the rows as files hold them
    return run


def test_supervisor_exits_non_zero_after_a_stop_so_afterok_is_not_met(tmp_path):
    env = {"SLURM_JOB_ID": "7"}
    run = _run_with(
        tmp_path,
        [
            {"event": "started", "job_id": "7", "attempt": 1},
            {"event": "stopped", "job_id": "7", "attempt": 1, "class": "crash"},
        ],
    )
    assert supervise.supervise(str(run.path), 0, env) == supervise.EXIT_STOPPED != 0
    done = _run_with(
        tmp_path / "b",
        [
            {"event": "started", "job_id": "7", "attempt": 1},
            {"event": "finished", "job_id": "7", "attempt": 1},
        ],
    )
    assert supervise.supervise(str(done.path), 0, env) == 0


def test_status_explains_a_big_run_blocked_by_its_failed_smoke(tmp_path):
    smoke = _run_with(
        tmp_path / "s",
        [
            {"event": "started", "job_id": "1", "attempt": 1},
            {"event": "failed", "job_id": "1", "attempt": 1, "class": "crash", "error": "boom"},
            {"event": "stopped", "job_id": "1", "attempt": 1, "class": "crash", "error": "boom"},
        ],
    )
    rows = [events.Submitted(time=1.0, job_id="3", smoke_job_id="2", smoke_run=str(smoke.path))]
    held = blocked(rows)
    assert held is not None and held["state"] == "blocked: smoke failed"
    assert held["error"] == "boom" and held["class"] == "smoke crash"
    assert blocked(rows + [events.Started(time=2.0)]) is None
