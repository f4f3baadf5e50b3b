"""Our flags are ours (issue 35, build 6): an sbatch_extra / srun_extra option slurmtrain owns is
refused at login in one line naming the key that does it, or merged where that is the meaning
(comment beside the run tag, mem_per_cpu/mem_per_gpu for our memory, dependency on the first
submission only); a boolean renders as a bare flag or is refused."""

from __future__ import annotations

import re

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import schema, slurm_cmd
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.rundir import locate
from slurmtrain.login import slurm_submit
from slurmtrain.login.prepare import resolve
from tests.conftest import run_cli

schema.register()
GPU = ["gpus_per_node=8", "cluster.partition=gpu", "cluster.cpus_per_task=4", "cluster.mem=0"]


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=slurm", f"runs_root={tmp_path}", *overrides])
    return resolve(cfg)


def _script(cfg):
    return slurm_submit.render_sbatch(cfg, locate(cfg))


REFUSED = [
    ("signal=B:USR1@180", "cluster.signal_lead_s"),
    ("ntasks_per_node=1", "gpus_per_node=N"),
    ("ntasks=4", "nodes= and gpus_per_node="),
    ("nodes=3", "nodes=N"),
    ("N=3", "nodes=N"),
    ("requeue=false", "faults."),
    ("open_mode=truncate", "appends"),
    ("output=/tmp/x.out", "runs_root"),
    ("error=/tmp/x.err", "runs_root"),
    ("job_name=other", "name=NAME"),
    ("J=other", "name=NAME"),
    ("time=1:00:00", "cluster.time"),
    ("hold=false", "cannot be turned off"),
]


@pytest.mark.parametrize("extra,fix", REFUSED, ids=[r[0] for r in REFUSED])
def test_an_owned_sbatch_option_is_refused_naming_the_key(tmp_path, extra, fix):
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, f"+cluster.sbatch_extra.{extra}")
    line = str(err.value)
    assert line.startswith(f"cluster.sbatch_extra.{extra.split('=')[0]}") and fix in line
    assert "\n" not in line


SRUN_REFUSED = [
    ("--ntasks=1", "nodes= and gpus_per_node="),
    ("-n1", "nodes= and gpus_per_node="),
    ("--output=x", "runs_root"),
    ("--kill-on-bad-exit=0", "--kill-on-bad-exit=1"),
    ("--cpu-bind=none", "cluster.cpu_bind"),
    ("--wait=0", "--wait=60"),
    ("--nodelist=n1", "faults.spare_nodes"),
]


@pytest.mark.parametrize("arg,fix", SRUN_REFUSED, ids=[r[0] for r in SRUN_REFUSED])
def test_an_owned_srun_option_is_refused(tmp_path, arg, fix):
    with pytest.raises(ConfigError, match=re.escape(f"cluster.srun_extra='{arg}'")) as err:
        _cfg(tmp_path, f"cluster.srun_extra=['{arg}']")
    assert fix in str(err.value)


def test_others_pass_and_true_is_a_bare_flag(tmp_path):
    cfg = _cfg(tmp_path, "+cluster.sbatch_extra.hold=true", "+cluster.sbatch_extra.reservation=r1")
    cfg.cluster.srun_extra = ["--mpi=none", "--distribution=block:cyclic"]
    text = _script(cfg)
    assert "#SBATCH --hold\n" in text and "#SBATCH --reservation=r1\n" in text
    assert "--mpi=none" in text and "--requeue=" not in text and "#SBATCH --requeue\n" in text


def test_a_user_comment_is_kept_beside_the_run_tag(tmp_path):
    cfg = _cfg(tmp_path, "+cluster.sbatch_extra.comment=project-x")
    run = locate(cfg)
    text = _script(cfg)
    tag = slurm_submit.run_tag(run.path)
    [line] = [ln for ln in text.splitlines() if ln.startswith("#SBATCH --comment")]
    assert line == f'#SBATCH --comment="{tag} project-x"'
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    # What the real submission passes sbatch (slurm_cmd.sbatch) and `cli cancel` reads back.
    assert slurm_cmd.script_comment(str(script)).split() == [tag, "project-x"]
    with pytest.raises(ConfigError, match="cluster.sbatch_extra.comment"):
        _cfg(tmp_path, "+cluster.sbatch_extra.comment='two words'")


def test_user_memory_replaces_ours(tmp_path):
    assert "#SBATCH --mem=0\n" in _script(_cfg(tmp_path, *GPU))
    for key in ("mem_per_cpu", "mem_per_gpu"):
        text = _script(_cfg(tmp_path, *GPU, f"+cluster.sbatch_extra.{key}=4G"))
        mems = [ln for ln in text.splitlines() if ln.startswith("#SBATCH --mem")]
        assert mems == [f"#SBATCH --{key.replace('_', '-')}=4G"], mems
    with pytest.raises(ConfigError, match="beside cluster.mem=100G"):
        _cfg(tmp_path, *GPU[:-1], "cluster.mem=100G", "+cluster.sbatch_extra.mem_per_cpu=4G")


def test_a_user_dependency_is_the_first_submissions_only(tmp_path):
    cfg = _cfg(tmp_path, "+cluster.sbatch_extra.dependency=afterany:123")
    run = locate(cfg)
    assert "--dependency" not in _script(cfg)  # job.sbatch: a hand resubmission does not wait
    ex = slurm_submit.executor(cfg, tmp_path / "submitit", [str(run.path)])
    first = ex._make_submission_file_text("unused", "uid")
    assert "#SBATCH --dependency=afterany:123\n" in first
    chained = slurm_submit.executor(cfg, tmp_path / "s", [str(run.path)], after="77")
    text = chained._make_submission_file_text("unused", "uid")
    assert "#SBATCH --dependency=afterok:77,afterany:123\n" in text


def test_the_dry_run_refuses_in_one_line(workdir):
    done = run_cli(
        ["cluster=local", "+cluster.sbatch_extra.signal=B:USR1@180", "dry_run=true"], cwd=workdir
    )
    assert done.returncode == 2
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cluster.signal_lead_s" in lines[0], lines
