"""job.sbatch and the submitit script come from one set of flags; containers get the exact command."""

from __future__ import annotations

import re
import shlex
import sys

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import schema, secrets
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.rundir import locate
from slurmtrain.login import slurm_submit
from slurmtrain.login.prepare import resolve

schema.register()


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=slurm", f"runs_root={tmp_path}", *overrides])
    return resolve(cfg)


def _sbatch_flags(text: str) -> dict[str, str]:
    flags = {}
    for line in text.splitlines():
        m = re.match(r"#SBATCH --([\w-]+)(?:=(.*))?$", line)
        if m:
            flags[m[1]] = shlex.split(m[2])[0] if m[2] else True
    return flags


def _srun_line(text: str) -> str:
    line = next(line.strip() for line in text.splitlines() if line.strip().startswith("srun "))
    return line.removesuffix(" &")  # in the background: the batch shell traps SIGTERM


def test_job_sbatch_and_submitit_script_carry_the_same_flags(tmp_path):
    cfg = _cfg(
        tmp_path,
        "nodes=2",
        "gpus_per_node=8",
        "cluster.partition=gpu",
        "cluster.qos=high",
        "cluster.exclusive=true",
        "cluster.signal_lead_s=300",
    )
    run = locate(cfg)
    ours = _sbatch_flags(slurm_submit.render_sbatch(cfg, run))
    ex = slurm_submit.executor(cfg, tmp_path / "submitit", [str(run.path)])
    theirs = _sbatch_flags(ex._make_submission_file_text("true", "uid"))
    for key, value in ours.items():
        if key != "output":
            assert theirs.get(key) == value, key
    assert ours["signal"] == "USR2@300" and ours["requeue"] is True
    assert ours["ntasks-per-node"] == "8" and ours["gpus-per-node"] == "8"
    assert ours["open-mode"] == "append" and ours["exclusive"] is True
    for arg in ("--kill-on-bad-exit=1", "--wait=60"):
        assert arg in ex.parameters["srun_args"] and arg in _srun_line(
            slurm_submit.render_sbatch(cfg, run)
        )


def test_bare_metal_apptainer_and_pyxis_command_lines(tmp_path):
    bare = _cfg(tmp_path)
    run = locate(bare)
    assert _srun_line(slurm_submit.render_sbatch(bare, run)).endswith(
        f"{shlex.quote(sys.executable)} -u -m slurmtrain.compute.attempt {run.path}"
    )

    app = _cfg(tmp_path, "cluster.container=apptainer", "cluster.image=/images/train.sif")
    line = _srun_line(slurm_submit.render_sbatch(app, locate(app)))
    assert line.endswith(
        f"--kill-on-bad-exit=1 --wait=60 apptainer exec --nv --bind {tmp_path} "
        f"/images/train.sif python -u -m slurmtrain.compute.attempt {locate(app).path}"
    )

    pyx = _cfg(
        tmp_path, "cluster.container=pyxis", "cluster.image='nvcr.io#nvidia/pytorch:24.05-py3'"
    )
    argv = shlex.split(_srun_line(slurm_submit.render_sbatch(pyx, locate(pyx))))
    assert argv[-9:] == [
        "--kill-on-bad-exit=1",
        "--wait=60",
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        f"--container-mounts={tmp_path}:{tmp_path}",
        "python",
        "-u",
        "-m",
        "slurmtrain.compute.attempt",
        str(locate(pyx).path),
    ]


@pytest.mark.parametrize(
    "override,key",
    [
        ("cluster.partition='gpu\nhostname'", "cluster.partition"),
        ("cluster.account='a;b'", "cluster.account"),
        ("cluster.constraint='$(id)'", "cluster.constraint"),
    ],
)
def test_values_that_cannot_be_quoted_in_sbatch_lines_are_refused(tmp_path, override, key):
    with pytest.raises(ConfigError, match=re.escape(key)):  # by validation, for any cluster kind
        cfg = _cfg(tmp_path, override)
        slurm_submit.render_sbatch(cfg, locate(cfg))


def test_body_values_are_shell_quoted(tmp_path):
    cfg = _cfg(tmp_path, "+cluster.env.NOTE='$(touch /tmp/x); `id`'")
    text = slurm_submit.render_sbatch(cfg, locate(cfg))
    # cluster.env is configuration, exported in job.sbatch (issue 35): only $NAME/${NAME} expand
    assert 'export NOTE="\\$(touch /tmp/x); \\`id\\`"' in text
    assert "NOTE" not in (secrets.values(cfg) or {})
