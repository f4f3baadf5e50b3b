"""cluster.master_port (issue 35, build 3): a fixed rendezvous port, exported by job.sbatch and
used by every srun step; the plan says where it can collide. Default: derived from the job id."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import schema
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.rundir import locate
from slurmtrain.common.slurm_text import master_port, rendezvous_from_env
from slurmtrain.login import flags, slurm_submit
from slurmtrain.login.prepare import resolve

schema.register()
STEP = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3"}
STEP |= {"SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2"}


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=slurm", f"runs_root={tmp_path}", *overrides])
    return resolve(cfg)


def test_default_port_is_derived_per_job_and_step():
    assert rendezvous_from_env(STEP)["MASTER_PORT"] == str(master_port("4242", 3))
    other_step = rendezvous_from_env({**STEP, "SLURM_STEP_ID": "4"})["MASTER_PORT"]
    assert other_step != rendezvous_from_env(STEP)["MASTER_PORT"]
    # MASTER_PORT left in the submitting shell does not pin it
    assert rendezvous_from_env({**STEP, "MASTER_PORT": "1"})["MASTER_PORT"] != "1"


def test_a_fixed_port_reaches_every_step_through_job_sbatch(tmp_path):
    cfg = _cfg(tmp_path, "cluster.master_port=29123")
    script = slurm_submit.render_sbatch(cfg, locate(cfg))
    assert "\nexport SLURMTRAIN_MASTER_PORT=29123\n" in script
    for step in ("0", "1", "7"):  # in-allocation restarts are new steps: the same port
        env = {**STEP, "SLURM_STEP_ID": step, "SLURMTRAIN_MASTER_PORT": "29123"}
        assert rendezvous_from_env(env)["MASTER_PORT"] == "29123"
    assert "SLURMTRAIN_MASTER_PORT" not in slurm_submit.render_sbatch(_cfg(tmp_path), locate(cfg))


def test_the_plan_says_where_a_fixed_port_collides(tmp_path):
    shared = flags.port_note(_cfg(tmp_path, "cluster.master_port=29123"))
    assert shared and "collide" in shared and "cluster.exclusive=true" in shared
    assert "SO_REUSEADDR" in shared  # restarts in the allocation: the previous step's port
    alone = flags.port_note(_cfg(tmp_path, "cluster.master_port=29123", "cluster.exclusive=true"))
    assert alone and "no other job binds it" in alone
    assert flags.port_note(_cfg(tmp_path)) is None


@pytest.mark.parametrize("port", [80, 70000])
def test_a_port_out_of_range_is_refused(tmp_path, port):
    with pytest.raises(ConfigError, match=f"^cluster.master_port={port}: a TCP port 1024..65535"):
        _cfg(tmp_path, f"cluster.master_port={port}")
