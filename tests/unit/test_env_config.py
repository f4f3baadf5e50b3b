"""cluster.env is configuration (issue 35, build 1): written into job.sbatch and the dry run,
exported by the batch shell so `$VAR` and `${VAR}` expand at job time, nothing else in a value
reaching the shell; secrets are the explicit set (cluster.secrets, credential-named keys)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from slurmtrain.common import rundir, schema, secrets
from slurmtrain.common.errors import ConfigError
from slurmtrain.login import flags, slurm_submit
from slurmtrain.login.prepare import _check_slurm_values, resolve

schema.register()
HEX40 = "0123456789abcdef0123456789abcdef01234567"
# Hydra's override grammar: `\${X}` is the text ${X} (a bare ${X} is an interpolation).
BRACED = "+cluster.env.OMP_NUM_THREADS=\\${SLURM_CPUS_PER_TASK}"


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=slurm", f"runs_root={tmp_path}", *overrides])
    return resolve(cfg)


def _exports(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("export ")]


HOSTILE = {
    "SEMI": "a; touch {canary}",
    "TICKS": "`touch {canary}`",
    "SUBST": "$(touch {canary})",
    "QUOTES": 'it\'s "quoted" \\ here',
    "ARITH": "$((1+1)) $$ $1 ${{X:-d}} ${{",
    "PATHLIKE": "/opt/efa/lib:$LD_LIBRARY_PATH",
    "JOB": "/tmp/$USER-miopen-${{SLURM_JOB_ID}}",
}


def test_hostile_values_reach_the_job_literally_and_only_vars_expand(tmp_path):
    canary = tmp_path / "canary"
    given = {k: v.format(canary=canary) for k, v in HOSTILE.items()}
    cfg = _cfg(tmp_path)
    with open_dict(cfg):  # as a config file would hold them (OmegaConf's escaping)
        for key, value in given.items():
            cfg.cluster.env[key] = secrets.kept_literal(value)
    assert dict(cfg.cluster.env) == given
    script = slurm_submit.render_sbatch(cfg, rundir.locate(cfg))
    lines = _exports(script)
    assert 'export PATHLIKE="/opt/efa/lib:$LD_LIBRARY_PATH"' in lines
    assert 'export JOB="/tmp/$USER-miopen-${SLURM_JOB_ID}"' in lines
    shell = "\n".join(lines) + "\nfor v in " + " ".join(given) + '; do printf "%s\\0" "${!v}"; done'
    job_env = {"LD_LIBRARY_PATH": "/l", "USER": "me", "SLURM_JOB_ID": "42", "PATH": os.defpath}
    done = subprocess.run(["bash", "-c", shell], env=job_env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    seen = dict(zip(given, done.stdout.split("\0")))
    expected = {k: flags.expanded(v, job_env) for k, v in given.items()}
    assert seen == expected
    assert seen["PATHLIKE"] == "/opt/efa/lib:/l" and seen["JOB"] == "/tmp/me-miopen-42"
    assert seen["SUBST"] == f"$(touch {canary})" and seen["ARITH"].startswith("$((1+1)) $$ $1")
    assert not canary.exists()
    assert not secrets.values(cfg)  # configuration, not secrets: no secrets.env is sourced
    assert "secrets.env" not in script


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "x\x1by"])
def test_control_characters_are_refused_in_one_line(tmp_path, value):
    cfg = _cfg(tmp_path)
    with open_dict(cfg):
        cfg.cluster.env["BAD"] = value
    with pytest.raises(ConfigError, match=r"^cluster.env.BAD: control characters"):
        _check_slurm_values(cfg)


def test_braced_variable_passes_hydra_and_config_yaml_reads_back(tmp_path):
    cfg = _cfg(tmp_path, BRACED, "+cluster.env.NCCL_SOCKET_IFNAME=ib0")
    assert cfg.cluster.env.OMP_NUM_THREADS == "${SLURM_CPUS_PER_TASK}"
    run = rundir.locate(cfg)
    data = secrets.referenced(schema.plain(cfg))  # what config.yaml records (login/prepare.py)
    rundir.create(run, cfg, [], data=data)
    script = slurm_submit.render_sbatch(cfg, run)
    assert 'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK}"' in script
    assert 'export NCCL_SOCKET_IFNAME="ib0"' in script
    text = run.config.read_text()
    assert "OMP_NUM_THREADS: \\${SLURM_CPUS_PER_TASK}" in text and "NCCL_SOCKET_IFNAME: ib0" in text
    loaded = schema.load_run_config(str(run.config))  # the compute side: no interpolation error
    assert schema.plain(loaded)["cluster"]["env"]["OMP_NUM_THREADS"] == "${SLURM_CPUS_PER_TASK}"
    assert secrets.referenced(loaded)["cluster"]["env"]["NCCL_SOCKET_IFNAME"] == "ib0"
    # The dry run's YAML shows it as it is written on the command line.
    assert "OMP_NUM_THREADS: \\${SLURM_CPUS_PER_TASK}" in secrets.redacted_yaml(cfg)


def test_secrets_are_the_explicit_set(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SITE_PASSPHRASE_FILE", "/secret/path")
    monkeypatch.setenv("DB_URL", "postgres://u:hunter2@db/x")
    cfg = _cfg(
        tmp_path,
        f"+cluster.env.WANDB_API_KEY={HEX40}",  # named like a credential
        "+cluster.env.WANDB_BASE_URL='https://me:pw@wandb.example'",  # a password in a URL
        "+cluster.env.CUDA_LAUNCH_BLOCKING=1",
        "cluster.secrets=[DB_URL]",  # by name, from this shell
    )
    run = rundir.locate(cfg)
    data = secrets.referenced(schema.plain(cfg))
    rundir.create(run, cfg, [], data=data)
    secrets.write_env_file(run.path, cfg)
    script = slurm_submit.render_sbatch(cfg, run)
    kept = (run.path / "secrets.env").read_text()
    for value in (HEX40, "me:pw", "hunter2"):
        assert value in kept and value not in script and value not in run.config.read_text()
    assert 'export CUDA_LAUNCH_BLOCKING="1"' in script and "CUDA_LAUNCH" not in kept
    assert f". {run.path}/secrets.env || {{" in script
    assert "- DB_URL" in run.config.read_text()  # the name is recorded, not the value
    assert set(secrets.job_environment(cfg)[secrets.NAMES_VAR].split()) == {
        "WANDB_API_KEY",
        "WANDB_BASE_URL",
        "DB_URL",
    }
    # The fingerprint is the same without any of it: cluster.* is placement, not the result.
    assert rundir.fingerprint(cfg, data) == rundir.fingerprint(_cfg(tmp_path))


def test_a_named_secret_missing_from_the_shell_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("NOT_EXPORTED_HERE", raising=False)
    cfg = _cfg(tmp_path)
    cfg.cluster.secrets = ["NOT_EXPORTED_HERE"]
    with pytest.raises(ConfigError, match=r"^cluster.secrets: NOT_EXPORTED_HERE is not set"):
        _check_slurm_values(cfg)
    cfg.cluster.secrets = ["1-bad"]
    with pytest.raises(ConfigError, match="not an environment variable name"):
        _check_slurm_values(cfg)


def test_local_runs_expand_like_the_batch_shell():
    class C:  # the only keys local_env reads
        class cluster:  # noqa: N801
            env = {"A": "x-$HOME", "B": "${A}/y", "C": "$(id)", "HF_TOKEN": "t"}

    out = flags.local_env(C, {"HOME": "/h"})  # type: ignore[arg-type]
    assert out == {"A": "x-/h", "B": "x-/h/y", "C": "$(id)"}
    assert not re.search("HF_TOKEN", str(out))


def test_a_sweep_array_refuses_points_whose_env_differs(tmp_path):
    """One array, one script: the points must export the same cluster.env (else separate runs)."""
    a = _cfg(tmp_path, "+cluster.env.NCCL_ALGO=Ring")
    b = _cfg(tmp_path, "+cluster.env.NCCL_ALGO=Tree", "optim.lr=1e-4")
    with pytest.raises(ConfigError, match="Slurm flags or cluster.env differ"):
        slurm_submit.submit_array([(a, rundir.locate(a)), (b, rundir.locate(b))], tmp_path / "s")
