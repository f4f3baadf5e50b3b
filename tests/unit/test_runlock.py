"""The run lock where flock excludes nothing: Lustre `localflock` and NFS
`local_lock=all|flock` grant each node its own flock, Lustre `noflock` raises ENOSYS. The mount
options pick a lease file instead; the lease is tested for real (processes contending)."""

from __future__ import annotations

import errno
import fcntl
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmtrain.common import runlock
from slurmtrain.common.rundir import RunDir

# Real mountinfo lines (proc(5) format) from Lustre and NFS clients and a local disk.
LINES = {
    "lustre_flock": "361 29 0:62 / /lustre/fs1 rw,relatime shared:190 - lustre "
    "10.10.0.1@o2ib:10.10.0.2@o2ib:/fs1 rw,flock,lazystatfs,encrypt",
    "lustre_localflock": "362 29 0:63 / /scratch rw,relatime shared:191 - lustre "
    "172.16.0.5@tcp:/scratch rw,localflock,lazystatfs",
    "lustre_default": "363 29 0:64 / /project rw,relatime shared:192 - lustre "
    "172.16.0.5@tcp:/project rw,lazystatfs",
    "nfs4_server_locks": "45 29 0:45 / /home rw,relatime shared:33 - nfs4 filer:/export/home "
    "rw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,"
    "sec=sys,clientaddr=10.1.1.2,local_lock=none,addr=10.1.1.1",
    "nfs4_local_all": "46 29 0:46 / /shared\\040runs rw,relatime shared:34 - nfs4 filer:/runs "
    "rw,vers=4.1,hard,proto=tcp,sec=sys,clientaddr=10.1.1.2,local_lock=all,addr=10.1.1.1",
    "nfs3_local_flock": "47 29 0:47 / /data rw,relatime shared:35 - nfs filer:/data rw,vers=3,"
    "hard,proto=tcp,mountproto=udp,local_lock=flock,addr=10.1.1.1",
    "nfs3_nolock": "48 29 0:48 / /old rw,relatime shared:36 - nfs filer:/old rw,vers=3,hard,"
    "nolock,proto=tcp,local_lock=all,addr=10.1.1.1",
    "ext4": "27 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro",
}


@pytest.mark.parametrize(
    "path,kind,why",
    [
        ("/lustre/fs1/runs/demo", "flock", "lustre mounted with flock"),
        ("/scratch/u/runs", "lease", "lustre localflock"),
        ("/project/runs", "lease", "noflock (lustre's default)"),
        ("/home/u/runs", "flock", "nfs4: flock goes to the server"),
        ("/shared runs/x", "lease", "nfs4 local_lock=all"),
        ("/data/runs", "lease", "nfs local_lock=flock"),
        ("/old/runs", "lease", "nfs local_lock=all"),
        ("/var/tmp/runs", "flock", "ext4: flock"),
    ],
)
def test_mount_options_pick_the_lock(path, kind, why):
    mounts = runlock.parse_mountinfo("\n".join(LINES.values()))
    got = runlock.lock_for(runlock.mount_of(Path(path), mounts))
    assert got[0] == kind and why in got[1]


def test_this_machines_mountinfo_parses():
    mounts = runlock.parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    assert runlock.mount_of(Path("/"), mounts) is not None


def test_a_localflock_mount_gets_the_lease(tmp_path, monkeypatch):
    """A localflock mount takes the lease, not flock: there two nodes would both hold the flock."""
    info = tmp_path / "mountinfo"
    info.write_text(f"27 1 0:90 / {tmp_path} rw - lustre 10.0.0.1@tcp:/fs rw,localflock\n")
    monkeypatch.setattr(runlock, "MOUNTINFO", info)
    run = RunDir(tmp_path / "run")
    with run.locked(timeout=1):
        holder = json.loads((run.path / ".owner.lease").read_text())
        assert holder["pid"] and holder["host"] and holder["token"]
    assert not (run.path / ".owner.lease").exists()


def test_flock_raising_enosys_falls_back_to_the_lease(tmp_path, monkeypatch):
    """Lustre noflock: flock raises ENOSYS, which escaped RunDir.locked as an OSError."""

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    run = RunDir(tmp_path / "run")
    with run.locked(timeout=1):
        assert (run.path / ".owner.lease").exists()
    assert runlock.choose(run.path)[0] == "lease"  # remembered for this process


HOLD = """
import sys, time
from pathlib import Path
from slurmtrain.common import runlock
lease = runlock.Lease(Path(sys.argv[1]), beat_s=0.3, stale_s=3)
with lease.held(30, RuntimeError):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
print("lost" if lease.lost else "released", flush=True)
"""


def holder(path: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_two_processes_contend_and_the_heartbeat_keeps_the_lease(tmp_path):
    path = tmp_path / ".owner.lease"
    proc = holder(path, 8)  # beats every 0.3 s for 8 s: longer than our stale bound of 3 s
    try:
        with pytest.raises(RuntimeError, match="holds the lease"):
            runlock.Lease(path, beat_s=0.3, stale_s=3).acquire(5, RuntimeError)
        second = runlock.Lease(path, beat_s=0.3, stale_s=3)
        with second.held(60, RuntimeError):  # waits for the release, not for staleness
            assert json.loads(path.read_text())["token"] == second.token
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert proc.stdout.read().strip() == "released"


def test_a_stale_lease_is_taken_over(tmp_path):
    path = tmp_path / ".owner.lease"
    proc = holder(path, 600)
    proc.kill()  # a holder that died: on this host its dead pid makes the lease stale at once
    proc.wait()
    started = time.monotonic()
    with runlock.Lease(path, stale_s=3).held(30, RuntimeError):
        pass
    assert time.monotonic() - started < 3
    # Another node's holder (a pid we cannot check) that stopped beating: stale after stale_s.
    path.write_text(json.dumps({"host": "n7-elsewhere", "pid": 1, "job": "99", "token": "x"}))
    started = time.monotonic()
    with runlock.Lease(path, stale_s=2).held(30, RuntimeError) as lease:
        assert json.loads(path.read_text())["token"] == lease.token
    assert time.monotonic() - started >= 2


def test_a_lease_taken_over_under_its_holder_is_not_released_by_it(tmp_path):
    path = tmp_path / ".owner.lease"
    first = runlock.Lease(path, beat_s=0.2)
    first.acquire(1, RuntimeError)
    path.write_text(json.dumps({"token": "someone-else"}))  # taken over while it stalled
    time.sleep(0.6)
    first.release()
    assert first.lost and json.loads(path.read_text())["token"] == "someone-else"


def test_doctor_says_which_lock_the_runs_root_gets_and_why(tmp_path, monkeypatch):
    from slurmtrain.cli.doctor.storage import check_run_root

    assert "run lock: flock (" in check_run_root(tmp_path).value
    info = tmp_path / "mountinfo"
    info.write_text(f"27 1 0:90 / {tmp_path} rw - nfs4 filer:/runs rw,vers=4.2,local_lock=all\n")
    monkeypatch.setattr(runlock, "MOUNTINFO", info)
    value = check_run_root(tmp_path).value
    assert "run lock: lease (nfs4 local_lock=all: flock excludes within one node only)" in value


HOLD_RUN = """
import sys, time
from pathlib import Path
from slurmtrain.common.rundir import RunDir
with RunDir(Path(sys.argv[1])).locked(timeout=30):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_a_flock_holder_also_holds_the_lease_for_nodes_without_coherent_flock(
    tmp_path, monkeypatch
):
    """A login node mounted with flock and compute nodes with localflock: the compute side takes
    the lease, so the flock holder must hold it too or the two never exclude each other."""
    from slurmtrain.common.rundir import RunLocked

    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_RUN, str(run), "30"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        info = tmp_path / "mountinfo"
        info.write_text(f"27 1 0:90 / {tmp_path} rw - lustre 10.0.0.1@tcp:/fs rw,localflock\n")
        monkeypatch.setattr(runlock, "MOUNTINFO", info)
        with pytest.raises(RunLocked, match="holds the lease"):
            with RunDir(run).locked(timeout=3):
                pass
    finally:
        proc.kill()
        proc.wait()


def test_a_lease_left_by_a_flock_holder_is_taken_at_once_by_the_next(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    left = {"host": "login-elsewhere", "pid": 1, "job": None, "token": "old", "flock": True}
    (run.path / ".owner.lease").write_text(json.dumps(left))
    started = time.monotonic()
    with run.locked(timeout=30):
        assert json.loads((run.path / ".owner.lease").read_text())["token"] != "old"
    assert time.monotonic() - started < runlock.STALE_S / 2
