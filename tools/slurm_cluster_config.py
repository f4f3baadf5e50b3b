"""The local test cluster's configuration: slurm.conf, gres.conf, slurmdbd.conf and daemon paths.

Split from tools/slurm_cluster.py (which starts and stops the daemons): one object, `Cluster`,
owns every file name and config line of the harness.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Optional

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
BIG_NODES = 18  # partition big: the 16-node scale drill and its 2 spares


def sh(
    args: list[str],
    check: bool = True,
    capture_output: bool = True,
    env: Optional[Mapping[str, str]] = None,
) -> subprocess.CompletedProcess[str]:
    """Run an argument list (never a shell string), capturing text output."""
    res = subprocess.run(args, text=True, capture_output=capture_output, env=env)
    if check and res.returncode != 0:
        sys.exit(
            f"slurm_cluster: {' '.join(args)} failed ({res.returncode}): "
            f"{(res.stderr or res.stdout or '').strip()[-800:]}"
        )
    return res


def wait_for(what: str, ok: Callable[[], bool], timeout: float, log: Path | None = None) -> None:
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

    def __init__(self, state_dir: Path, nodes: int, gpu_nodes: int = 0, big_nodes: int = 0) -> None:
        self.dir, self.nodes, self.gpu_nodes, self.big_nodes = (
            state_dir,
            nodes,
            gpu_nodes,
            big_nodes,
        )
        self.log, self.run, self.spool = state_dir / "log", state_dir / "run", state_dir / "spool"
        self.etc, self.db = state_dir / "etc", state_dir / "mysql"
        self.sock = self.run / "mysqld.sock"
        self.cpu_names = [f"n{i}" for i in range(1, nodes + 1)]
        self.gpu_names = [f"n{i}" for i in range(nodes + 1, nodes + gpu_nodes + 1)]
        first_big = nodes + gpu_nodes + 1
        self.big_names = [f"n{i}" for i in range(first_big, first_big + big_nodes)]
        self.names = self.cpu_names + self.gpu_names + self.big_names
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
        if self.big_names:  # the scale drill's own nodes: a 16-node run leaves debug's 4 alone
            lines.append(
                f"PartitionName=big Nodes={','.join(self.big_names)} "
                "MaxTime=1-00:00:00 PriorityTier=1 PreemptMode=OFF State=UP"
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

    def oci_conf(self) -> str:
        """`srun --container=BUNDLE` through runc (Debian's; crun refuses this host's hybrid
        cgroups). RunTimeRun: one foreground `runc run` per task, which forwards the signals Slurm
        sends the task (USR2, TERM) to the Python inside; Kill/Delete clean up after a failed
        step. Container ids carry the node name: many slurmd share this machine's runc state."""
        runc = f"runc --root={self.run}/runc"
        cid = "%n.%u.%j.%s.%t"
        return (
            "\n".join(
                [
                    MARK,
                    f'RunTimeQuery="{runc} state {cid}"',
                    f'RunTimeKill="{runc} kill -a {cid} SIGTERM"',
                    f'RunTimeDelete="{runc} delete --force {cid}"',
                    # exec: slurmstepd runs the pattern with /bin/sh -c, and a step's signal
                    # (USR2 at the time limit) killed that shell, masking the ranks' exit codes
                    f'RunTimeRun="exec {runc} run {cid} -b %b"',
                ]
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
            ("oci.conf", self.oci_conf()),  # read at each container step: no restart needed
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
        for fname in ["slurm.conf", "slurmdbd.conf", "gres.conf", "oci.conf"]:
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
