"""cluster.stage_env without Slurm: the pack (made once, reused by its hash), the batch script's
staging block, the ranks' wrapper (staged python, else the shared one), validation, the plan's
advice. The 2-node run is tests/cluster/test_stage_env.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from slurmtrain.common.errors import ConfigError
from slurmtrain.login import stage_env


def _venv(root: Path) -> Path:
    """A tiny stand-in environment: one package in site-packages, a python that says its name."""
    site = root / "lib" / "python3.11" / "site-packages" / "torch"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("")
    (root / "bin").mkdir()
    python = root / "bin" / "python"
    python.write_text('#!/bin/sh\necho "python of $0 with $* staged=$SLURMTRAIN_STAGED_ENV"\n')
    python.chmod(0o755)
    return root


def _cfg(tmp_path: Path, **cluster):
    base = {"stage_env": True, "stage_env_dir": str(tmp_path / "local"), "stage_env_cache": None}
    return OmegaConf.create({"runs_root": str(tmp_path / "runs"), "cluster": {**base, **cluster}})


def test_the_pack_is_made_once_and_reused_until_the_environment_changes(tmp_path, monkeypatch):
    env = _venv(tmp_path / "venv")
    monkeypatch.setattr(sys, "prefix", str(env))
    cfg = _cfg(tmp_path)
    first = stage_env.ensure_pack(cfg)
    assert first.parent == tmp_path / "runs" / ".env_packs" and first.exists()
    made = first.stat().st_mtime_ns
    assert stage_env.ensure_pack(cfg) == first and first.stat().st_mtime_ns == made  # reused
    (env / "lib" / "python3.11" / "site-packages" / "numpy").mkdir()  # an install
    assert stage_env.ensure_pack(cfg) != first


def test_a_python_outside_any_venv_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "prefix", sys.base_prefix)
    with pytest.raises(ConfigError, match=r"cluster.stage_env=true: .*not in a virtual env"):
        stage_env.ensure_pack(_cfg(tmp_path))


def test_unpack_then_run_uses_this_nodes_copy_and_falls_back_to_the_shared_python(
    tmp_path, monkeypatch
):
    env = _venv(tmp_path / "venv")
    monkeypatch.setattr(sys, "prefix", str(env))
    cfg = _cfg(tmp_path)
    values = stage_env.script_values(cfg, pack=True)
    # cluster.stage_env_dir does not exist yet: the first node to stage makes it
    shared = tmp_path / "shared-python"
    shared.write_text('#!/bin/sh\necho "shared python with $*"\n')
    shared.chmod(0o755)
    wrapper = stage_env.python_command(cfg, [str(shared)])

    def on(node: str, argv: list[str]) -> str:
        task = dict(os.environ, SLURMD_NODENAME=node, SLURM_JOB_ID="7")
        done = subprocess.run(argv, env=task, capture_output=True, text=True, check=True)
        return done.stdout

    unpack = ["/bin/sh", "-c", values["unpack"], values["dir"], values["key"], values["archive"]]
    on("n1", unpack)
    mine = tmp_path / "local" / f"slurmtrain-envs-{os.getuid()}"
    copy = f"{mine}/{values['key']}-n1"
    assert Path(copy, "bin", "python").exists() and not Path(f"{mine}/{values['key']}-n2").exists()
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
    on("n1", unpack)  # idempotent
    assert [p.name for p in mine.iterdir() if not p.name.startswith(".lock")] == [Path(copy).name]
    assert on("n1", [*wrapper, "-u", "-m", "x y"]) == (
        f"python of {copy}/bin/python with -u -m x y staged={copy}\n"
    )
    assert on("n2", [*wrapper, "-u"]) == "shared python with -u\n"  # n2 never unpacked


def test_a_pack_that_does_not_match_its_manifest_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(_venv(tmp_path / "venv")))
    cfg = _cfg(tmp_path)
    pack = stage_env.ensure_pack(cfg)
    assert stat.S_IMODE(pack.parent.stat().st_mode) == 0o700  # run_dir_mode's default
    good = pack.read_bytes()
    with monkeypatch.context() as m:  # unchanged since hashed (inode, ctime): not read again
        m.setattr(stage_env, "sha256_of", lambda path: pytest.fail("hashed again"))
        assert stage_env.verified(pack)
    pack.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # same size, one bit flipped
    assert not stage_env.verified(pack)
    assert stage_env.ensure_pack(cfg) == pack and pack.read_bytes() == good


def test_a_node_never_extracts_a_pack_that_does_not_match_its_manifest(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(_venv(tmp_path / "venv")))
    values = stage_env.script_values(_cfg(tmp_path), pack=True)
    (tmp_path / "local").mkdir()
    pack = Path(values["archive"])
    manifest = stage_env.manifest(pack)
    size = manifest.read_text().split()[1]
    manifest.write_text(f"{'0' * 64} {size}\n")  # swapped after submission
    task = dict(os.environ, SLURMD_NODENAME="n1")
    argv = ["/bin/sh", "-c", values["unpack"], values["dir"], values["key"], values["archive"]]
    done = subprocess.run(argv, env=task, capture_output=True, text=True)
    assert done.returncode != 0 and "does not match its manifest" in done.stderr
    mine = tmp_path / "local" / f"slurmtrain-envs-{os.getuid()}"
    assert [p.name for p in mine.iterdir() if not p.name.startswith(".lock")] == []  # no partial


def test_the_batch_script_stages_once_per_node_before_the_ranks_start(tmp_path, monkeypatch):
    from slurmtrain.common.rundir import locate
    from slurmtrain.login import slurm_submit
    from tests.unit.test_launch_path import _cfg as composed

    monkeypatch.setattr(sys, "prefix", str(_venv(tmp_path / "venv")))
    cfg = composed(tmp_path, "nodes=2", "cluster.stage_env=true", "cluster.stage_env_dir=/l d")
    script = slurm_submit.render_sbatch(cfg, locate(cfg))
    stage = script.index('srun --nodes="$SLURM_JOB_NUM_NODES"')
    assert stage < script.index("-m slurmtrain.compute.attempt")
    assert "--ntasks-per-node=1" in script[stage : stage + 200]
    assert " '/l d' " in script  # config values quoted for the shell
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr
    plain = slurm_submit.render_sbatch(composed(tmp_path, "nodes=2"), locate(cfg))
    assert "slurmtrain-envs-" not in plain and "SLURMD_NODENAME" not in plain


@pytest.mark.parametrize(
    "override,key",
    [
        ("cluster.container=apptainer", "cluster.stage_env=true with cluster.container"),
        ("cluster.stage_env_dir=tmp", "cluster.stage_env_dir='tmp'"),
        ("cluster=local", "cluster.stage_env=true: the batch script stages"),
    ],
)
def test_bad_staging_settings_fail_with_one_line(tmp_path, override, key):
    from tests.conftest import run_cli

    done = run_cli(
        ["cluster=slurm", "cluster.stage_env=true", "cluster.image=docker://x", override],
        cwd=tmp_path,
        env={"SLURMTRAIN_AUTO": "off"},
    )
    assert done.returncode != 0 and key in done.stderr + done.stdout


def test_the_plan_advises_staging_from_16_nodes():
    from slurmtrain.planning import policy

    def cfg(nodes, **cluster):
        c = {"kind": "slurm", "stage_env": False, "container": "none", **cluster}
        return OmegaConf.create(
            {"nodes": nodes, "gpus_per_node": 8, "cluster": {"cpu_tasks_per_node": 2, **c}}
        )

    assert "cluster.stage_env=true" in policy.stage_env_advice(cfg(64))
    assert "512 ranks on 64 nodes" in policy.stage_env_advice(cfg(64))
    assert policy.stage_env_advice(cfg(4)) is None
    assert policy.stage_env_advice(cfg(64, stage_env=True)) is None
    assert policy.stage_env_advice(cfg(64, kind="local")) is None


def test_two_jobs_on_one_node_extract_once_and_a_killed_ones_partial_copy_is_redone(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(sys, "prefix", str(_venv(tmp_path / "venv")))
    values = stage_env.script_values(_cfg(tmp_path), pack=True)
    mine = tmp_path / "local" / f"slurmtrain-envs-{os.getuid()}"
    mine.mkdir(parents=True, mode=0o700)
    stale = mine / f".partial-{values['key']}-n1.AbCdEf"  # a job killed while extracting
    (stale / "env" / "bin").mkdir(parents=True)
    argv = ["/bin/sh", "-c", values["unpack"], values["dir"], values["key"], values["archive"]]
    jobs = [
        subprocess.Popen(argv, env=dict(os.environ, SLURMD_NODENAME="n1", SLURM_JOB_ID=job))
        for job in ("1", "2")
    ]
    assert [job.wait() for job in jobs] == [0, 0]
    left = sorted(p.name for p in mine.iterdir() if not p.name.startswith(".lock"))
    assert left == [f"{values['key']}-n1"]  # one copy, no partial of either job or the killed one
    assert Path(mine, left[0], "bin", "python").exists()
