"""One Slurm launch path: submitit's submission file IS job.sbatch's script, field by field.

The first attempt goes through submitit; every restart and a hand resubmission run job.sbatch. Any
difference in the srun line, the exported environment or the supervisor would make a restarted
job behave unlike the first one.
"""

from __future__ import annotations

import re
import shlex

from hydra import compose, initialize_config_dir

from slurmtrain.common import schema
from slurmtrain.common.rundir import locate
from slurmtrain.login import slurm_submit
from slurmtrain.login.prepare import resolve

schema.register()


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=slurm", f"runs_root={tmp_path}", *overrides])
    return resolve(cfg)


def _fields(text: str) -> dict[str, object]:
    """The parts of a batch script that decide how the job runs."""
    lines = [line.strip() for line in text.splitlines()]
    srun = next(line for line in lines if line.startswith("srun "))
    exports = dict(
        line[len("export ") :].split("=", 1) for line in lines if line.startswith("export ")
    )
    sbatch = [line for line in lines if line.startswith("#SBATCH")]
    after = lines[lines.index(srun) + 1 :]
    srun = srun.removesuffix(" &")  # started in the background: the batch shell traps SIGTERM
    return {"srun": shlex.split(srun), "env": exports, "sbatch": sbatch, "after_srun": after}


def test_submitit_submission_file_equals_job_sbatch_field_by_field(tmp_path):
    cfg = _cfg(
        tmp_path,
        "nodes=2",
        "gpus_per_node=8",
        "cluster.partition=gpu",
        "+cluster.env.NCCL_IB_HCA=mlx5",
        "cluster.srun_extra=['--mpi=none']",  # --cpu-bind is cluster.cpu_bind's (issue 35)
    )
    run = locate(cfg)
    ours = _fields(slurm_submit.render_sbatch(cfg, run))
    ex = slurm_submit.executor(cfg, tmp_path / "submitit", [str(run.path)])
    theirs = _fields(ex._make_submission_file_text("unused", "uid"))
    assert theirs["srun"] == ours["srun"]
    # cluster.env is configuration: exported by both (issue 35); nothing secret, no secrets.env
    assert theirs["env"] == ours["env"] and ours["env"]["NCCL_IB_HCA"] == '"mlx5"'
    assert "secrets.env" not in slurm_submit.render_sbatch(cfg, run)
    assert theirs["sbatch"] == ours["sbatch"]
    assert theirs["after_srun"] == ours["after_srun"]
    srun = ours["srun"]
    assert srun[-3:] == ["-m", "slurmtrain.compute.attempt", str(run.path)]
    assert f"--output={run.logs}/%j_%t.out" in srun and f"--error={run.logs}/%j_%t.err" in srun
    assert "--cpu-bind=cores" in srun
    supervisor = " ".join(ours["after_srun"])
    # The supervisor is a shell function (host Python, or the image as a one-task step)
    assert f"supervise supervise {run.path}" in supervisor
    assert '-m "slurmtrain.batch.$1"' in slurm_submit.render_sbatch(cfg, run)


def test_array_tasks_run_the_same_srun_line_on_their_own_run(tmp_path):
    cfg = _cfg(tmp_path, "nodes=2")
    run = locate(cfg)
    single = _fields(slurm_submit.render_sbatch(cfg, run))
    mapping = tmp_path / "sweep.json"
    ex = slurm_submit.executor(cfg, tmp_path / "s", [], parallelism=4, array_map=str(mapping))
    ex.parameters["map_count"] = 3
    text = ex._make_submission_file_text("unused", "uid")
    array = _fields(text)
    assert "#SBATCH --array=0-2%3" in array["sbatch"]
    assert array["env"] == single["env"]
    # Same srun line; only where the run directory comes from differs ($RUN_DIR, from the map).
    literal = [a.replace(str(run.path), "$RUN_DIR") for a in single["srun"]]
    assert array["srun"] == literal
    assert re.search(r"^RUN_DIR=\$\(.*SLURM_ARRAY_TASK_ID.*\) \|\| exit 2$", text, re.M)
    assert 'exec >>"$RUN_DIR/logs/$SLURM_JOB_ID.batch.out" 2>&1' in text
