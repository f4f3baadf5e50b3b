#!/usr/bin/env python3
"""A real Slurm cluster on one machine: munge, mariadb, slurmdbd, slurmctld and N virtual nodes.

Why: sbatch, srun, preemption, node failure, requeue and sacct must be tested against Slurm itself,
not a mock. Every node is a `slurmd -N nK` on 127.0.0.1 with its own port and spool directory.

    python tools/slurm_cluster.py install
    python tools/slurm_cluster.py start [--nodes 4] [--gpu-nodes 2] [--big-nodes 18] [--state-dir DIR]
    python tools/slurm_cluster.py status | stop [--keep-jobs] [--purge]

All state lives under the state dir (default $SLURMTRAIN_CLUSTER_DIR or /tmp/slurmtrain-cluster).
The configs are installed as /etc/slurm/slurm.conf and slurmdbd.conf (an existing foreign file is
backed up and restored on stop) so that a plain `sbatch` typed after `start` just works; node
names n1..nN are added to /etc/hosts so that MASTER_ADDR=n1 resolves like on a real cluster.

Partition `gpu` (nodes after the CPU ones, n5-n6 by default) declares count-only GPU GRES: each
node has `Gres=gpu:8` (gres.conf File= links to /dev/null: no real device files), 16 CPUs and 16000
MB (declared, not real: config_overrides). Slurm then schedules, validates and reports GPUs as on a
GPU cluster (`--gpus-per-node=8`, TRES gres/gpu, auto-detection), though no job there can touch
one: dry runs and `sbatch --test-only` are what it is for.

Partition `big` (the nodes after those, n7-n24 by default) is the scale drill's
(tests/cluster/test_scale_16.py: 16 nodes + 2 spares); debug and high keep n1-n4, so no other test
sees it. A slurmd takes ~6 MB: the 18 cost ~100 MB and nothing else while idle.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or imported by path
from slurm_cluster_config import (  # noqa: E402
    BIG_NODES,
    BINARIES,
    CLUSTER,
    DB_NAME,
    DB_PASS,
    DB_PORT,
    DB_USER,
    ETC,
    GPUS_PER_NODE,
    PACKAGES,
    RESPONSIVE,
    Cluster,
    sh,
    wait_for,
)


def munge_ok() -> bool:
    cred = subprocess.run(["munge", "-n"], capture_output=True)
    return (
        cred.returncode == 0
        and subprocess.run(["unmunge"], input=cred.stdout, capture_output=True).returncode == 0
    )


def start_munge(c: Cluster) -> None:
    if munge_ok():
        return
    for d in ["/run/munge", "/var/log/munge", "/var/lib/munge", "/etc/munge"]:
        Path(d).mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        key.write_bytes(os.urandom(1024))
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
        print("  created /etc/munge/munge.key")
    sh(["su", "-s", "/bin/sh", "munge", "-c", "munged --force"])
    wait_for("munged", munge_ok, 20, Path("/var/log/munge/munged.log"))
    shutil.copy(Path("/run/munge/munged.pid"), c.run / "munged.pid")  # ours: stop may end it
    print("  munged started")


def start_mariadb(c: Cluster) -> None:
    if c.pid("mariadb", "mariadbd"):
        return
    if not (c.db / "mysql").exists():
        shutil.rmtree(c.db, ignore_errors=True)
        sh(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={c.db}",
                "--user=root",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ]
        )
    c.sock.unlink(missing_ok=True)
    c.spawn(
        "mariadb",
        [
            "mariadbd",
            "--no-defaults",
            f"--datadir={c.db}",
            f"--socket={c.sock}",
            f"--port={DB_PORT}",
            "--bind-address=127.0.0.1",
            "--user=root",
            f"--pid-file={c.run / 'mariadbd.pid'}",
            f"--log-error={c.log / 'mariadb.log'}",
            "--innodb-use-native-aio=0",
            "--innodb-buffer-pool-size=128M",
            "--innodb-lock-wait-timeout=900",
            "--skip-name-resolve",
        ],
    )
    wait_for(
        "mariadb",
        lambda: sh(["mariadb-admin", f"--socket={c.sock}", "ping"], check=False).returncode == 0,
        60,
        c.log / "mariadb.log",
    )
    sql = f"CREATE DATABASE IF NOT EXISTS {DB_NAME};" + "".join(
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'{h}' IDENTIFIED BY '{DB_PASS}';"
        f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'{h}';"
        for h in ["127.0.0.1", "localhost"]
    )
    sh(["mariadb", f"--socket={c.sock}", "-u", "root", "-e", sql])
    print(f"  mariadb started (127.0.0.1:{DB_PORT}, datadir {c.db})")


def start_slurmdbd(c: Cluster) -> None:
    if not c.pid("slurmdbd", "slurmdbd"):
        sh(["slurmdbd"])
        print("  slurmdbd started")
    ready = lambda: (
        sh(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"], check=False).returncode
        == 0
    )
    wait_for("slurmdbd", ready, 60, c.log / "slurmdbd.log")
    out = sh(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"]).stdout.split()
    if CLUSTER not in out:
        sh(["sacctmgr", "-i", "add", "cluster", CLUSTER])
        print(f"  registered cluster {CLUSTER} with slurmdbd")


def node_states() -> dict[str, str]:
    res = sh(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
    if res.returncode != 0:
        return {}
    return dict(line.split()[:2] for line in res.stdout.splitlines() if line.strip())


def start_slurm(c: Cluster, conf_changed: bool) -> None:
    try:
        old_nodes = json.loads(c.meta.read_text())["names"]
    except (OSError, ValueError, KeyError):
        old_nodes = None
    if conf_changed and c.pid("slurmctld", "slurmctld"):
        # `scontrol reconfigure` in 22.05 neither adds/removes nodes nor applies GRES/TRES changes.
        stop_slurm(c, keep_jobs=True)
        print(f"  slurm.conf changed (nodes were {old_nodes}): daemons restarted")
    if not c.pid("slurmctld", "slurmctld"):
        sh(["slurmctld"])
        print("  slurmctld started")
    wait_for(
        "slurmctld",
        lambda: sh(["scontrol", "ping"], check=False).returncode == 0,
        60,
        c.log / "slurmctld.log",
    )
    restarted = []
    for name in c.names:
        (c.spool / name).mkdir(parents=True, exist_ok=True)
        if not c.pid(f"slurmd-{name}", "slurmd"):
            sh(["slurmd", "-N", name])
            restarted.append(name)
    if restarted:
        print(f"  slurmd started for {','.join(restarted)}")
    resumed: set[str] = set()

    def all_up() -> bool:
        states = node_states()
        for name in set(restarted) - resumed:  # answering again, but marked DOWN meanwhile
            if states.get(name) in {"down", "drain"}:
                sh(["scontrol", "update", f"nodename={name}", "state=resume"], check=False)
                resumed.add(name)
        return all(states.get(n) in RESPONSIVE for n in c.names)

    wait_for(f"nodes {','.join(c.names)} to answer", all_up, 120, c.log / "slurmctld.log")


def stop_slurm(c: Cluster, keep_jobs: bool) -> None:
    if not keep_jobs and c.pid("slurmctld", "slurmctld"):
        jobs = sh(["squeue", "-h", "-o", "%A"], check=False).stdout.split()
        if jobs:
            sh(["scancel", *jobs], check=False)
            print(f"  cancelled {len(jobs)} job(s)")
            end = time.monotonic() + 20
            while (
                time.monotonic() < end
                and sh(["squeue", "-h", "-t", "R,CG", "-o", "%A"], check=False).stdout.strip()
            ):
                time.sleep(0.5)
    for f in sorted(c.run.glob("slurmd-*.pid")):
        c.kill(f.stem, "slurmd")
    c.kill("slurmctld", "slurmctld")


def missing_binaries() -> list[str]:  # Debian puts the daemons in /usr/sbin, off a user's PATH
    return [b for b in BINARIES if not shutil.which(b) and not Path("/usr/sbin", b).exists()]


# ---- commands --------------------------------------------------------------------------------
def cmd_install(_: argparse.Namespace) -> None:
    missing = missing_binaries()
    if not missing:
        print("slurm_cluster: Slurm, munge and mariadb are installed")
        return
    if os.geteuid() != 0:
        sys.exit(f"slurm_cluster: missing {', '.join(missing)}; run `install` as root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    print(f"slurm_cluster: installing {' '.join(PACKAGES)} (missing: {', '.join(missing)})")
    sh(["apt-get", "update"], env=env, capture_output=False)
    sh(["apt-get", "install", "-y", *PACKAGES], env=env, capture_output=False)


def cmd_start(a: argparse.Namespace) -> None:
    t0 = time.monotonic()
    c = Cluster(a.state_dir, a.nodes, a.gpu_nodes, a.big_nodes)
    if os.geteuid() != 0:
        sys.exit("slurm_cluster: start needs root (munge, /etc/slurm, /etc/hosts)")
    missing = missing_binaries()
    if missing:
        sys.exit(f"slurm_cluster: missing {', '.join(missing)}; run `python {sys.argv[0]} install`")
    for d in [c.log, c.run, c.spool / "ctld", c.etc]:
        d.mkdir(parents=True, exist_ok=True)
    print(
        f"slurm_cluster: starting {a.nodes} node(s) + {a.gpu_nodes} GPU-GRES node(s) + "
        f"{a.big_nodes} in partition big, "
        f"state in {c.dir}"
    )
    start_munge(c)
    start_mariadb(c)
    changed = c.install_confs()
    c.set_hosts(c.names)
    start_slurmdbd(c)
    start_slurm(c, changed)
    c.meta.write_text(
        json.dumps(
            {
                "nodes": a.nodes,
                "gpu_nodes": a.gpu_nodes,
                "big_nodes": a.big_nodes,
                "names": c.names,
            }
        )
        + "\n"
    )
    print(sh(["sinfo"]).stdout.rstrip())
    print(
        f"slurm_cluster: up in {time.monotonic() - t0:.1f}s; nodes {','.join(c.names)}; "
        f"partitions debug (default, preemptible) and high"
        + (
            f", gpu ({','.join(c.gpu_names)}: gres gpu:{GPUS_PER_NODE}, no real devices)"
            if c.gpu_names
            else ""
        )
        + (f", big ({c.big_names[0]}-{c.big_names[-1]})" if c.big_names else "")
        + f"; SLURM_CONF={ETC / 'slurm.conf'}"
    )


def cmd_stop(a: argparse.Namespace) -> None:
    c = Cluster(a.state_dir, 0)
    if not c.run.exists():
        print(f"slurm_cluster: nothing to stop in {c.dir}")
        return
    print(f"slurm_cluster: stopping the cluster in {c.dir}")
    stop_slurm(c, a.keep_jobs)
    c.kill("slurmdbd", "slurmdbd")
    c.kill("mariadb", "mariadbd")
    c.kill("munged", "munged")  # only when start launched it (the pid file is ours)
    c.uninstall_confs()
    c.set_hosts([])
    if a.purge:
        shutil.rmtree(c.dir, ignore_errors=True)
        print(f"  removed {c.dir}")
    print("slurm_cluster: stopped")


def cmd_restart_ctld(a: argparse.Namespace) -> None:
    """Stop only slurmctld (SIGTERM: it saves its state), wait --down-s, start it again: a
    controller restart or failover as a running job meets it. Nodes and jobs are left alone."""
    c = Cluster(a.state_dir, 0)
    if not c.pid("slurmctld", "slurmctld"):
        sys.exit(f"slurm_cluster: no slurmctld of ours running (state dir {c.dir})")
    c.kill("slurmctld", "slurmctld")
    time.sleep(a.down_s)
    sh(["slurmctld"])
    print(f"  slurmctld started again after {a.down_s:g} s down")
    wait_for(
        "slurmctld",
        lambda: sh(["scontrol", "ping"], check=False).returncode == 0,
        60,
        c.log / "slurmctld.log",
    )


def cmd_status(a: argparse.Namespace) -> None:
    res = sh(["sinfo"], check=False)
    print((res.stdout or res.stderr).rstrip())
    if res.returncode != 0:
        sys.exit(f"slurm_cluster: not running (state dir {a.state_dir})")
    print(sh(["squeue"], check=False).stdout.rstrip())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["install", "start", "stop", "status", "restart-ctld"])
    p.add_argument("--nodes", type=int, default=4, help="virtual nodes n1..nN (start)")
    p.add_argument(
        "--gpu-nodes",
        type=int,
        default=2,
        help="start: nodes after n1..nN in partition gpu, count-only gres gpu:8 (0: none)",
    )
    p.add_argument(
        "--big-nodes",
        type=int,
        default=BIG_NODES,
        help="start: nodes after the GPU ones in partition big, for the 16-node scale drill "
        "(0: none; ~6 MB per slurmd)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get("SLURMTRAIN_CLUSTER_DIR", "/tmp/slurmtrain-cluster")),
    )
    p.add_argument(
        "--down-s", type=float, default=15, help="restart-ctld: seconds slurmctld stays down"
    )
    p.add_argument("--keep-jobs", action="store_true", help="stop: do not cancel queued jobs")
    p.add_argument(
        "--purge",
        action="store_true",
        help="stop: also delete the state dir (job ids restart at 1)",
    )
    a = p.parse_args(argv)
    if not 1 <= a.nodes <= 64:
        p.error(f"--nodes {a.nodes}: use 1..64")
    if not 0 <= a.gpu_nodes <= 8:
        p.error(f"--gpu-nodes {a.gpu_nodes}: use 0..8")
    if not 0 <= a.big_nodes <= 64:
        p.error(f"--big-nodes {a.big_nodes}: use 0..64")
    a.state_dir = a.state_dir.resolve()
    cmd = {
        "install": cmd_install,
        "start": cmd_start,
        "stop": cmd_stop,
        "status": cmd_status,
        "restart-ctld": cmd_restart_ctld,
    }
    if a.command in {
        "start",
        "stop",
        "restart-ctld",
    }:  # test sessions may call `start` at the same moment
        a.state_dir.parent.mkdir(parents=True, exist_ok=True)
        lock = open(a.state_dir.parent / f".{a.state_dir.name}.lock", "w")
        fcntl.flock(lock, fcntl.LOCK_EX)  # held until this process exits
    cmd[a.command](a)


if __name__ == "__main__":
    main()
