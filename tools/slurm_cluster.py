#!/usr/bin/env python3
"""A real Slurm cluster on one machine: munge, mariadb, slurmdbd, slurmctld and N virtual nodes.

Why: sbatch, srun, preemption, node failure, requeue and sacct must be tested against Slurm itself,
not a mock. Every node is a `slurmd -N nK` on 127.0.0.1 with its own port and spool directory.

    python tools/slurm_cluster.py install
    python tools/slurm_cluster.py start [--nodes 4] [--gpu-nodes 2] [--state-dir DIR]
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
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd", "mariadb-server"]
BINARIES = [
    "slurmctld",
    "slurmd",
    "slurmdbd",
    "sbatch",
    "srun",
    "sacct",
    "sacctmgr",
    "munged",
    "mariadbd",
    "mariadb-install-db",
]
MARK = "# managed by slurmtrain tools/slurm_cluster.py"
ETC = Path("/etc/slurm")
HOSTS = Path("/etc/hosts")
CLUSTER = "slurmtrain"
DB_PORT = int(os.environ.get("SLURMTRAIN_DB_PORT", "3307"))
NODE_PORT0 = 17000
DB_USER, DB_PASS, DB_NAME = "slurm", "slurmtrain", "slurm_acct_db"
RESPONSIVE = {"idle", "mix", "alloc", "comp"}  # sinfo %t states of a node that answers
GPUS_PER_NODE, GPU_NODE_CPUS, GPU_NODE_MEM_MB = 8, 16, 16000  # the gpu partition's declared nodes


def sh(args: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run an argument list (never a shell string), capturing text output."""
    kw.setdefault("capture_output", True)
    res = subprocess.run(args, text=True, **kw)
    if check and res.returncode != 0:
        sys.exit(
            f"slurm_cluster: {' '.join(args)} failed ({res.returncode}): "
            f"{(res.stderr or res.stdout or '').strip()[-800:]}"
        )
    return res


def wait_for(what: str, ok, timeout: float, log: Path | None = None) -> None:
    """Poll ok() until true; on timeout exit naming what and the log to read."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ok():
            return
        time.sleep(0.5)
    tail = log.read_text(errors="replace").splitlines()[-15:] if log and log.exists() else []
    sys.exit(
        f"slurm_cluster: timed out after {timeout:.0f}s waiting for {what}"
        + (f"; last lines of {log}:\n" + "\n".join(tail) if log else "")
    )


class Cluster:
    """Paths and daemons of one local cluster; every daemon it starts has a pid file here."""

    def __init__(self, state_dir: Path, nodes: int, gpu_nodes: int = 0) -> None:
        self.dir, self.nodes, self.gpu_nodes = state_dir, nodes, gpu_nodes
        self.log, self.run, self.spool = state_dir / "log", state_dir / "run", state_dir / "spool"
        self.etc, self.db = state_dir / "etc", state_dir / "mysql"
        self.sock = self.run / "mysqld.sock"
        self.cpu_names = [f"n{i}" for i in range(1, nodes + 1)]
        self.gpu_names = [f"n{i}" for i in range(nodes + 1, nodes + gpu_nodes + 1)]
        self.names = self.cpu_names + self.gpu_names
        self.meta = state_dir / "cluster.json"

    def pid(self, name: str, comm: str) -> int | None:
        """Live pid recorded in run/<name>.pid whose command line is still `comm` (no pid reuse)."""
        f = self.run / f"{name}.pid"
        try:
            pid = int(f.read_text().split()[0])
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except (OSError, ValueError, IndexError):
            return None
        return pid if os.path.basename(cmd) == comm else None

    def kill(self, name: str, comm: str) -> None:
        pid = self.pid(name, comm)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            end = time.monotonic() + 15
            while self.pid(name, comm) and time.monotonic() < end:  # a zombie has no cmdline
                time.sleep(0.2)
            if self.pid(name, comm):
                os.kill(pid, signal.SIGKILL)
            print(f"  stopped {name} (pid {pid})")
        (self.run / f"{name}.pid").unlink(missing_ok=True)

    def spawn(self, name: str, args: list[str]) -> int:
        """Start a foreground daemon detached from us and record its pid."""
        with open(self.log / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        (self.run / f"{name}.pid").write_text(f"{proc.pid}\n")
        return proc.pid

    def slurm_conf(self) -> str:
        d, n = self.dir, self.nodes
        host = socket.gethostname().split(".")[0]
        lines = [
            MARK,
            f"ClusterName={CLUSTER}",
            f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # a requeued job waits cred_expire (Slurm's default: 120 s) before it may start
            # again; sites tune it, and the test suite would spend minutes waiting at 120
            "AuthInfo=cred_expire=10",
            f"StateSaveLocation={d}/spool/ctld",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/run/slurmctld.pid",
            f"SlurmdPidFile={d}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log",
            f"SlurmdLogFile={d}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "MailProg=/bin/true",
            # containers have no usable cgroups; linuxproc tracks job processes by parentage
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SlurmdParameters=config_overrides",
            # jobs share nodes core by core unless --exclusive; memory is not a consumable
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            # periodic main scheduling pass every 10 s (Slurm's default is 60 s)
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=5,sched_interval=10",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            "JobRequeue=1",
            # a killed slurmd goes DOWN in ~30-40 s; a restarted one comes back by itself
            "ReturnToService=2",
            "SlurmdTimeout=10",
            "SlurmctldTimeout=30",
            "InactiveLimit=0",
            "KillWait=15",
            "MinJobAge=300",
            "MessageTimeout=10",
            "Waittime=0",
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherFrequency=30",
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=localhost",
            "AccountingStoragePort=6819",
            "JobCompType=jobcomp/none",
        ]
        if self.gpu_names:  # TRES lists gres/gpu (what `scontrol show partition` reports) only so
            lines += ["GresTypes=gpu", "AccountingStorageTRES=gres/gpu"]
        for i, name in enumerate(self.names, 1):
            shape = (
                f"CPUs={GPU_NODE_CPUS} RealMemory={GPU_NODE_MEM_MB} Gres=gpu:{GPUS_PER_NODE}"
                if name in self.gpu_names
                else "CPUs=2 RealMemory=4000"
            )
            lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 "
                f"Port={NODE_PORT0 + i} {shape} State=UNKNOWN"
            )
        allnodes = f"n[1-{n}]" if n > 1 else "n1"
        lines += [
            f"PartitionName=debug Nodes={allnodes} Default=YES MaxTime=02:00:00 "
            "PriorityTier=1 PreemptMode=REQUEUE GraceTime=20 State=UP",
            f"PartitionName=high Nodes={allnodes} MaxTime=1-00:00:00 PriorityTier=10 "
            "PreemptMode=OFF State=UP",
        ]
        if self.gpu_names:
            lines.append(
                f"PartitionName=gpu Nodes={','.join(self.gpu_names)} MaxTime=1-00:00:00 "
                "PriorityTier=1 PreemptMode=OFF State=UP"
            )
        return "\n".join(lines) + "\n"

    def gres_conf(self) -> str:
        """GPUs nobody can touch. Slurm 22.05 drops file-less GPUs ("Removing file-less GPU") and
        wants character devices, so each node's 8 GPUs are links to /dev/null under the state dir
        (no /dev/nvidia* is created; task/none constrains no devices)."""
        dev = self.dir / "dev"
        dev.mkdir(parents=True, exist_ok=True)
        for i in range(GPUS_PER_NODE):
            link = dev / f"nvidia{i}"
            if not link.is_symlink():
                link.unlink(missing_ok=True)
                link.symlink_to("/dev/null")
        files = f"{dev}/nvidia[0-{GPUS_PER_NODE - 1}]"
        return (
            "\n".join(
                [MARK] + [f"NodeName={name} Name=gpu File={files}" for name in self.gpu_names]
            )
            + "\n"
        )

    def dbd_conf(self) -> str:
        d = self.dir
        return (
            "\n".join(
                [
                    MARK,
                    "AuthType=auth/munge",
                    "DbdHost=localhost",
                    "DbdAddr=127.0.0.1",
                    "DbdPort=6819",
                    "SlurmUser=root",
                    "DebugLevel=info",
                    f"LogFile={d}/log/slurmdbd.log",
                    f"PidFile={d}/run/slurmdbd.pid",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={DB_PORT}",
                    f"StorageUser={DB_USER}",
                    f"StoragePass={DB_PASS}",
                    f"StorageLoc={DB_NAME}",
                ]
            )
            + "\n"
        )

    def install_confs(self) -> bool:
        """Write the configs here and into /etc/slurm; True when slurm.conf changed."""
        self.etc.mkdir(parents=True, exist_ok=True)
        ETC.mkdir(parents=True, exist_ok=True)
        changed = False
        for fname, text in [
            ("slurm.conf", self.slurm_conf()),
            ("slurmdbd.conf", self.dbd_conf()),
            ("gres.conf", self.gres_conf()),
        ]:
            (self.etc / fname).write_text(text)
            target = ETC / fname
            old = target.read_text() if target.exists() else None
            if old == text:
                continue
            changed |= fname in ("slurm.conf", "gres.conf")
            if old is not None and MARK not in old:
                backup = target.with_name(fname + ".slurmtrain-backup")
                print(f"  backing up {target} to {backup}")
                shutil.copy2(target, backup)
            target.write_text(text)
        os.chmod(ETC / "slurmdbd.conf", 0o600)  # slurmdbd refuses a readable password file
        return changed

    def uninstall_confs(self) -> None:
        for fname in ["slurm.conf", "slurmdbd.conf", "gres.conf"]:
            target, backup = ETC / fname, ETC / (fname + ".slurmtrain-backup")
            if target.exists() and MARK in target.read_text():
                target.unlink()
            if backup.exists():
                backup.replace(target)

    def set_hosts(self, names: list[str]) -> None:
        """Make node names resolve to 127.0.0.1 (one marked line in /etc/hosts)."""
        try:
            keep = [ln for ln in HOSTS.read_text().splitlines() if MARK not in ln]
            if names:
                keep.append(f"127.0.0.1 {' '.join(names)} {MARK}")
            HOSTS.write_text("\n".join(keep) + "\n")
        except OSError as exc:
            print(f"  warning: cannot edit {HOSTS} ({exc}); node names will not resolve")


# ---- components ------------------------------------------------------------------------------
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
    c = Cluster(a.state_dir, a.nodes, a.gpu_nodes)
    if os.geteuid() != 0:
        sys.exit("slurm_cluster: start needs root (munge, /etc/slurm, /etc/hosts)")
    missing = missing_binaries()
    if missing:
        sys.exit(f"slurm_cluster: missing {', '.join(missing)}; run `python {sys.argv[0]} install`")
    for d in [c.log, c.run, c.spool / "ctld", c.etc]:
        d.mkdir(parents=True, exist_ok=True)
    print(
        f"slurm_cluster: starting {a.nodes} node(s) + {a.gpu_nodes} GPU-GRES node(s), "
        f"state in {c.dir}"
    )
    start_munge(c)
    start_mariadb(c)
    changed = c.install_confs()
    c.set_hosts(c.names)
    start_slurmdbd(c)
    start_slurm(c, changed)
    c.meta.write_text(
        json.dumps({"nodes": a.nodes, "gpu_nodes": a.gpu_nodes, "names": c.names}) + "\n"
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
