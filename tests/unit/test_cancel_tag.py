"""Every job of a run carries the run's tag in job.sbatch itself (a hand `sbatch job.sbatch` too),
so `cli cancel` finds them all in one squeue; a start after a cancel does not train unless a user
submitted it after the cancel. Pure logic: Slurm's answers are given."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

from slurmtrain.common import events, schema
from slurmtrain.common.rundir import locate
from slurmtrain.login import slurm_submit
from slurmtrain.login.prepare import resolve

schema.register()


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=slurm", f"runs_root={tmp_path}", *overrides])
    return resolve(cfg)


def test_job_sbatch_carries_the_run_tag_and_a_sweep_array_does_not(tmp_path):
    from slurmtrain.common.slurm_cmd import script_comment

    cfg = _cfg(tmp_path)
    run = locate(cfg)
    script = slurm_submit.render_sbatch(cfg, run)
    tag = slurm_submit.run_tag(run.path)
    assert f"#SBATCH --comment={tag}\n" in script
    assert tag.startswith("slurmtrain:") and run.path.name in tag
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert script_comment(str(path)) == tag  # what sbatch() keeps beside its retry token
    other = _cfg(tmp_path, "name=other")
    assert slurm_submit.run_tag(locate(other).path) != tag
    array = slurm_submit.render_script(
        cfg, str(run.path), {"job-name": "x"}, "log", array_map="m.json"
    )
    assert "--comment" not in array  # one array, many runs: its tasks are found by the ledger


def test_cancel_finds_tagged_jobs_and_ledger_ids_in_one_listing():
    from slurmtrain.cli.cancel import active_of

    listing = (
        "101|slurmtrain:a/1@x slurmtrain-submit-ab|RUNNING\n"
        "102|slurmtrain:a/1@x|PENDING\n"  # a hand `sbatch job.sbatch`, held
        "103|slurmtrain:b/2@y|PENDING\n"  # another run
        "104|slurmtrain-submit-cd|PENDING\n"
        "105_2||PENDING\n"  # a sweep point's array task, named by the ledger
        "106|slurmtrain:a/1@x|COMPLETED\n"
    )
    assert active_of(listing, "slurmtrain:a/1@x", ["105_2", "99"]) == ["101", "102", "105_2"]


def test_a_start_after_a_cancel_trains_only_after_a_user_submission():
    from slurmtrain.compute.faults.owner import CANCELLED, LIFTED, cancelled_start

    base = [
        events.Submitted(time=1, job_id="7", executor="slurm"),
        events.Started(time=2, job_id="7"),
    ]
    cancel = events.Cancelled(time=5, job_ids=("7",))
    assert cancelled_start(base, {"7"}, lambda: 0.5) is None  # never cancelled
    rows = base + [cancel]
    assert cancelled_start(rows, {"7"}, lambda: 0.5) == CANCELLED  # a job it cancelled
    # a hand job submitted before the cancel and missed by it: cancelled
    assert cancelled_start(rows, {"8"}, lambda: 3.0) == CANCELLED
    # a hand job submitted after the cancel: a user submission, it lifts the cancel
    assert cancelled_start(rows, {"8"}, lambda: 6.0) == LIFTED
    # submitted in the cancel's own second (SubmitTime has whole seconds): maybe before it, and
    # missed by it (an untagged job): fail closed; the next second is after it
    assert cancelled_start(rows, {"8"}, lambda: 5.0) == CANCELLED
    assert (
        cancelled_start(
            rows[:-1] + [events.Cancelled(time=5.4, job_ids=("7",))], {"8"}, lambda: 5.0
        )
        == CANCELLED
    )
    # Slurm cannot say when: fail closed
    assert cancelled_start(rows, {"8"}, lambda: None) == CANCELLED
    # a supervisor's resubmission racing the cancel does not lift it
    resub = rows + [events.Submitted(time=6, job_id="9", executor="slurm", requeue_of="7")]
    assert cancelled_start(resub, {"9"}, lambda: 6.0) == CANCELLED
    # the user ran the same command again: that submission (and its restarts) train
    again = rows + [events.Submitted(time=9, job_id="10", executor="slurm")]
    assert cancelled_start(again, {"10"}, lambda: 9.0) is None
    later = again + [events.Submitted(time=12, job_id="11", executor="slurm", requeue_of="10")]
    assert cancelled_start(later, {"11"}, lambda: 12.0) is None
    # ... but a job the cancel named stays cancelled
    assert cancelled_start(again, {"7"}, lambda: 0.5) == CANCELLED
