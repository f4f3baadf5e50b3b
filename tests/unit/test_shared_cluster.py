"""A shared cluster, tried as another user of it would (issue 37, builds 1 and 2): a second Unix
user made by the test plants a staged python at the node-local paths, swaps a run directory, and
tries to hold a run's lock; with umask 000 nothing slurmtrain makes in a run is group- or
world-writable. Needs root to create the user: CI runs as root, so these never skip there."""

from __future__ import annotations

import fcntl
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Iterator

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from slurmtrain.common import rundir, runlock, schema
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.events import Submitted
from slurmtrain.login import prepare, stage_env
from tests.conftest import run_cli
from tests.unit.test_stage_env import _venv

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates a second Unix user: root only")
schema.register()


@pytest.fixture(scope="module")
def other() -> Iterator[pwd.struct_passwd]:
    """A second user of this machine, removed afterwards."""
    name = f"st_other_{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory both users reach (pytest's own tmp_path is root's, 0700)."""
    base = Path(tempfile.mkdtemp(prefix="st-shared-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_user(user: pwd.struct_passwd, act: Callable[[], object]) -> int:
    """Run `act` as `user` in a forked child: its exit code (0: done, 1: it raised)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover  (the child)
        code = 0
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            act()
        except SystemExit as exit:
            code = int(exit.code or 0)
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _cfg(root: Path, *overrides: str):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=local", f"runs_root={root}", *overrides])
    return prepare.resolve(cfg)


def test_a_planted_staging_directory_is_never_executed(other, shared, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(_venv(shared / "venv")))
    node = shared / "node-tmp"  # a node's /tmp: everyone writes, sticky
    node.mkdir(mode=0o1777)
    node.chmod(0o1777)
    cfg = OmegaConf.create(
        {
            "runs_root": str(shared / "runs"),
            "cluster": {"stage_env": True, "stage_env_dir": str(node), "stage_env_cache": None},
        }
    )
    values = stage_env.script_values(cfg, pack=True)
    key, marker = values["key"], shared / "marker"
    evil = f'#!/bin/sh\ntouch {marker}\necho "planted ran"\n'
    old = node / f"slurmtrain-env-{key}-n1"  # the path the last version executed
    mine = node / f"slurmtrain-envs-{os.getuid()}"  # ours from now on: the other user was first

    def plant() -> None:
        for python in (old / "bin" / "python", mine / f"{key}-n1" / "bin" / "python"):
            python.parent.mkdir(parents=True, mode=0o777)
            python.write_text(evil)
            python.chmod(0o777)
        mine.chmod(0o700)  # mode alone does not make it ours

    assert as_user(other, plant) == 0
    shared_python = shared / "shared-python"
    shared_python.write_text('#!/bin/sh\necho "shared python"\n')
    shared_python.chmod(0o755)
    task = dict(os.environ, SLURMD_NODENAME="n1", SLURM_JOB_ID="7")
    unpack = ["/bin/sh", "-c", values["unpack"], values["dir"], key, values["archive"]]
    wrapper = stage_env.python_command(cfg, [str(shared_python)])
    done = subprocess.run(unpack, env=task, capture_output=True, text=True)
    assert done.returncode != 0 and f"{mine} is not yours with mode 0700" in done.stderr
    ran = subprocess.run(wrapper, env=task, capture_output=True, text=True)
    assert ran.stdout == "shared python\n" and not marker.exists()
    # A link in its place (to the other user's directory) is refused too.
    shutil.rmtree(mine)
    planted = node / "elsewhere"
    assert as_user(other, lambda: shutil.copytree(old, planted / f"{key}-n1", symlinks=True)) == 0
    mine.symlink_to(planted)
    done = subprocess.run(unpack, env=task, capture_output=True, text=True)
    assert done.returncode != 0 and "is a symbolic link" in done.stderr
    assert subprocess.run(wrapper, env=task, capture_output=True, text=True).stdout == (
        "shared python\n"
    )
    # Once it is gone, the job makes its own 0700 directory and runs its own copy.
    mine.unlink()
    subprocess.run(unpack, env=task, capture_output=True, text=True, check=True)
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700 and mine.stat().st_uid == os.getuid()
    ran = subprocess.run(wrapper, env=task, capture_output=True, text=True, check=True)
    assert ran.stdout.startswith(f"python of {mine}/{key}-n1/bin/python")
    assert not marker.exists()


def test_a_swapped_run_directory_is_refused_in_one_line(other, shared, tmp_path):
    overrides = ["name=swap", "train.max_steps=1"]
    cfg = _cfg(shared / "runs", *overrides)
    run = rundir.locate(cfg)
    with run.locked():
        rundir.create(run, cfg, overrides)
    run.path.rename(run.path.with_name("aside"))  # the other user (with write there) swaps it
    run.path.mkdir()
    os.chown(run.path, other.pw_uid, other.pw_gid)
    with pytest.raises(ConfigError) as refused:
        with rundir.locate(cfg).locked():
            pass
    line = str(refused.value)
    assert "\n" not in line and str(run.path) in line and other.pw_name in line
    assert "remove it" in line
    # The real login path: exit 2, one line, nothing submitted into the swapped directory.
    env = {"SLURMTRAIN_AUTO": "off"}
    done = run_cli(["cluster=local", f"runs_root={shared / 'runs'}", *overrides], tmp_path, env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{run.path} is owned by {other.pw_name}" in done.stderr
    assert list(run.path.iterdir()) == []
    # Its dry run says so the same way (exit 2, the one line).
    dry = run_cli(["dry_run=true", *done.args[3:]], tmp_path, env)
    assert dry.returncode == 2 and f"{run.path} is owned by {other.pw_name}" in dry.stderr
    # Our own directory made writable by others is refused the same way.
    run.path.rmdir()
    run.path.with_name("aside").rename(run.path)
    run.path.chmod(0o777)
    with pytest.raises(ConfigError, match=r"writable by its group and others \(mode 0777\)"):
        rundir.create(run, cfg, overrides)


def test_a_link_in_a_run_directorys_place_is_followed_only_when_it_is_ours(other, shared):
    cfg = _cfg(shared / "runs", "name=linked")
    run = rundir.locate(cfg)
    scratch = shared / "scratch"
    scratch.mkdir(mode=0o700)
    run.path.parent.parent.mkdir(mode=0o700)
    run.path.parent.symlink_to(scratch)  # ours: runs/NAME -> /scratch/...
    with run.locked():
        rundir.create(run, cfg, [])
    assert (scratch / run.path.name / "config.yaml").is_file()
    os.chown(run.path.parent, other.pw_uid, other.pw_gid, follow_symlinks=False)  # planted
    with pytest.raises(ConfigError, match=f"is a symbolic link .* owned by {other.pw_name}"):
        rundir.create(run, cfg, [])


def test_a_read_only_user_cannot_hold_the_lock(other, shared):
    cfg = _cfg(shared / "runs", "name=locked")
    run = rundir.locate(cfg)
    with run.locked():
        rundir.create(run, cfg, [])
    for d in (run.path.parent.parent, run.path.parent, run.path):
        d.chmod(0o755)  # the other user may read the run (a group's read access, say)
    assert stat.S_IMODE(run.lock.stat().st_mode) == 0o600

    def hold() -> None:
        fd = os.open(run.lock, os.O_RDONLY)  # PermissionError: exit 1
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    assert as_user(other, hold) == 1
    with run.locked(timeout=5):  # the owner still takes it at once
        pass


def test_an_old_readable_lock_held_by_a_reader_is_replaced(other, shared, monkeypatch):
    # An older slurmtrain made the lock 0644: a reader could open and flock it.
    monkeypatch.setattr(runlock, "SQUAT_S", 0.3)  # how long it waits is not the point (2 s)
    cfg = _cfg(shared / "runs", "name=squat")
    run = rundir.locate(cfg)
    with run.locked():
        rundir.create(run, cfg, [])
    for d in (run.path.parent.parent, run.path.parent, run.path):
        d.chmod(0o755)
    run.lock.chmod(0o644)
    ready, release = os.pipe(), os.pipe()

    def squat() -> None:
        fd = os.open(run.lock, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(ready[1], b"x")
        os.read(release[0], 1)  # held until the owner is done

    pid = os.fork()
    if pid == 0:  # pragma: no cover
        os._exit(as_user(other, squat))
    try:
        assert os.read(ready[0], 1) == b"x"
        with run.locked(timeout=10):  # replaced after runlock.SQUAT_S
            assert stat.S_IMODE(run.lock.stat().st_mode) == 0o600
    finally:
        os.write(release[1], b"x")
        os.waitpid(pid, 0)


def _loose(root: Path) -> list[str]:
    found = []
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
            found.append(f"{path} {stat.S_IMODE(st.st_mode):04o}")
    return found


@pytest.mark.parametrize("mode", ["0700", "0750"])
def test_with_umask_000_nothing_made_in_a_run_is_group_or_world_writable(shared, mode):
    root = shared / "made" / "runs"  # its parents are made too

    def submit_and_start() -> None:
        os.umask(0)
        cfg = _cfg(root, "name=umask", f"run_dir_mode={mode}")
        with ExitStack() as locks:
            p = prepare.check(cfg, quiet=True, locks=locks)
            assert p is not None
            prepare.record(p, ["name=umask"])
            p.run.record(Submitted(executor="local"), job_id="1")
        os.umask(0)  # the compute side, started by hand from a shell with umask 000
        run = rundir.RunDir(p.run.path)
        with run.locked():
            run.record(Submitted(executor="local"), job_id="2")
            (run.logs / "rank0.out").write_text("a log")

    assert as_user(pwd.getpwuid(0), submit_and_start) == 0
    assert _loose(shared / "made") == []
    [run] = (root / "umask").iterdir()
    assert stat.S_IMODE(run.stat().st_mode) == int(mode, 8)
    assert stat.S_IMODE(root.stat().st_mode) == int(mode, 8)
    assert stat.S_IMODE((run / ".owner.lock").stat().st_mode) == 0o600
