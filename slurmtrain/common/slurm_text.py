"""Slurm text, parsed and written without Slurm: hostlists, time strings, job environment, partitions.

Pure functions (no subprocess, no torch), so they are tested without a cluster; the commands that
produce this text live in slurm_cmd.py. Hostlists are slurm_hostlist.py's, imported here too.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence, Union

# the hostlist functions stay importable from here too (`as`: re-exported)
from slurmtrain.common.slurm_hostlist import compress_hostlist as compress_hostlist
from slurmtrain.common.slurm_hostlist import expand_hostlist as expand_hostlist

# MASTER_PORT range 10000..32767: below Linux's ephemeral ports (net.ipv4.ip_local_port_range,
# 32768..60999 by default), so a port the kernel handed to some client socket on rank 0's node
# cannot collide with the rendezvous; above the well-known and most registered service ports.
PORT_BASE, PORT_SPAN = 10000, 32768 - 10000
FIXED_PORT_VAR = "SLURMTRAIN_MASTER_PORT"  # cluster.master_port, not a stray MASTER_PORT
_UNLIMITED = {"UNLIMITED", "INFINITE"}


class SlurmError(RuntimeError):
    """A Slurm command failed, or a Slurm variable we need is missing."""


# ---- time strings ------------------------------------------------------------------------------
def parse_time(text: str) -> Optional[int]:
    """Slurm `--time` -> seconds; None means no limit (`UNLIMITED`, `INFINITE`, or `0`).

    Forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
    """
    s = str(text).strip()
    if s.upper() in _UNLIMITED:
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", s)
    if not m:
        raise ValueError(f"{text!r} is not a Slurm time; use MM, HH:MM:SS or D-HH:MM:SS")
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        secs = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # HH:MM:SS
        secs = int(a) * 3600 + int(b) * 60 + int(c)
    else:  # MM or MM:SS
        secs = int(a) * 60 + int(b or 0)
    return None if secs == 0 else secs  # Slurm reads a zero limit as "no limit"


def format_time(seconds: Optional[int]) -> str:
    """Seconds -> `D-HH:MM:SS` (or `HH:MM:SS` under a day); None -> UNLIMITED."""
    if seconds is None:
        return "UNLIMITED"
    d, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"


# ---- job environment ---------------------------------------------------------------------------
def tasks_per_node(value: str) -> list[int]:
    """SLURM_TASKS_PER_NODE `2(x3),1` -> [2, 2, 2, 1]."""
    out: list[int] = []
    for part in value.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"SLURM_TASKS_PER_NODE {value!r}: cannot read {part!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def master_port(job_id: str, step_id: int = 0) -> int:
    """A port every task of a job step derives alike, spread over 10000..32767 by job id; each
    step of one job (an in-allocation restart is a new srun step) gets another port, so a new
    rendezvous never meets the previous step's socket."""
    key = int(job_id) if str(job_id).isdigit() else zlib.crc32(str(job_id).encode())
    return PORT_BASE + (key + 7919 * step_id) % PORT_SPAN


def rendezvous_from_env(env: Mapping[str, str]) -> dict[str, str]:
    """torch.distributed variables for a task started by srun, from its SLURM_* variables.

    MASTER_ADDR is the first host of the step (SLURM_STEP_NODELIST, where rank 0 runs), else of
    the job (SLURM_JOB_NODELIST / SLURM_NODELIST). Values are strings, ready for os.environ.
    """

    def need(*names: str) -> str:
        for n in names:
            if env.get(n):
                return env[n]
        raise SlurmError(f"{names[0]} is not set; start this under srun inside a Slurm job")

    nodelist = need("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    hosts = expand_hostlist(nodelist)
    step = env.get("SLURM_STEP_ID", "0")
    port = master_port(need("SLURM_JOB_ID", "SLURM_JOBID"), int(step) if step.isdigit() else 0)
    if env.get(FIXED_PORT_VAR, "").isdigit():  # cluster.master_port: every step uses it
        port = int(env[FIXED_PORT_VAR])
    out = {
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": str(port),
        "RANK": need("SLURM_PROCID"),
        "LOCAL_RANK": need("SLURM_LOCALID"),
        "WORLD_SIZE": need("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
    }
    node_id = env.get("SLURM_NODEID")
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if node_id is not None:
        out["NODE_RANK"] = node_id
        if per_node:
            counts = tasks_per_node(per_node)
            if int(node_id) < len(counts):
                out["LOCAL_WORLD_SIZE"] = str(counts[int(node_id)])
    return out


# ---- partitions --------------------------------------------------------------------------------
_KV = re.compile(r"([A-Za-z][\w/:.]*)=(.*?)(?=\s+[A-Za-z][\w/:.]*=|\s*$)", re.S)


def attempt_counters(env: Mapping[str, str]) -> tuple[int, int]:
    """(Slurm's requeue count, our in-allocation relaunches) of this job step: with the job id, the
    ledger's attempt key (the batch script exports SLURMTRAIN_RELAUNCH)."""
    return int(env.get("SLURM_RESTART_COUNT") or 0), int(env.get("SLURMTRAIN_RELAUNCH") or 0)


def parse_kv(record: str) -> dict[str, str]:
    """`A=1 B=x=y C=(null)` (scontrol's Key=Value records) -> dict; values may hold '='."""
    return {k: v.strip() for k, v in _KV.findall(record.strip())}


@dataclass(frozen=True)
class PartitionInfo:
    """What a plan needs to know about one partition (from `scontrol show partition`)."""

    name: str
    nodes: str  # Slurm hostlist, "" when none
    node_names: tuple[str, ...]
    total_nodes: int
    max_nodes: Optional[int]  # per job; None = UNLIMITED
    max_time_s: Optional[int]  # None = UNLIMITED
    default_time_s: Optional[int]
    default: bool
    state: str
    priority_tier: int
    preempt_mode: str
    grace_time_s: int
    total_cpus: int
    gpus: int  # gres/gpu over the whole partition
    tres: dict[str, str] = field(default_factory=dict)
    max_mem_per_node_mb: Optional[int] = None  # MaxMemPerNode; None = UNLIMITED

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.total_nodes if self.total_nodes else 0

    @property
    def gpu_type(self) -> Optional[str]:
        """The one GPU type the TRES names (`gres/gpu:h100=16` -> h100, where the site's
        AccountingStorageTRES tracks types); None when untyped (`gres/gpu=16`) or mixed."""
        types = {k.split(":", 1)[1] for k in self.tres if k.startswith("gres/gpu:")}
        return types.pop() if len(types) == 1 else None

    @property
    def cpus_per_node(self) -> int:
        """The partition's CPUs over its nodes (0: unknown)."""
        return self.total_cpus // self.total_nodes if self.total_nodes else 0

    @property
    def mem_per_node_mb(self) -> Optional[int]:
        """The partition's TRES memory over its nodes, in MiB (None: not reported)."""
        mem = mem_mb(self.tres.get("mem", ""))
        return mem // self.total_nodes if mem and self.total_nodes else None


def mem_mb(value: str) -> Optional[int]:
    """Slurm memory `16000M` / `64000G` / `2T` / `512` (MiB) -> MiB; None when not a size."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", value.strip())
    if not m:
        return None
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[m[2]]
    return int(float(m[1]) * scale)


def _int_or_none(value: str) -> Optional[int]:
    return None if value.upper() in _UNLIMITED | {"NONE", "N/A", ""} else int(value)


def _gpus(tres: Mapping[str, str]) -> int:
    plain = [v for k, v in tres.items() if k == "gres/gpu"]
    typed = [v for k, v in tres.items() if k.startswith("gres/gpu:")]
    counts = (re.match(r"\d+", v) for v in (plain or typed))
    return sum(int(m.group()) for m in counts if m)


def parse_partitions(text: str) -> dict[str, PartitionInfo]:
    """`scontrol show partition [-o]` output -> {name: PartitionInfo}, in Slurm's order."""
    out: dict[str, PartitionInfo] = {}
    for record in re.split(r"(?=\bPartitionName=)", text):
        kv = parse_kv(record)
        if "PartitionName" not in kv:
            continue
        tres = dict(p.split("=", 1) for p in kv.get("TRES", "").split(",") if "=" in p)
        nodes = "" if kv.get("Nodes", "(null)") == "(null)" else kv["Nodes"]
        names = tuple(expand_hostlist(nodes)) if nodes else ()
        dt = kv.get("DefaultTime", "NONE")
        out[kv["PartitionName"]] = PartitionInfo(
            name=kv["PartitionName"],
            nodes=nodes,
            node_names=names,
            total_nodes=int(kv.get("TotalNodes", len(names))),
            max_nodes=_int_or_none(kv.get("MaxNodes", "UNLIMITED")),
            max_time_s=parse_time(kv.get("MaxTime", "UNLIMITED")),
            default_time_s=None if dt.upper() == "NONE" else parse_time(dt),
            default=kv.get("Default", "NO") == "YES",
            state=kv.get("State", "UP"),
            priority_tier=int(kv.get("PriorityTier", 1)),
            preempt_mode=kv.get("PreemptMode", "OFF"),
            grace_time_s=int(kv.get("GraceTime", 0)),
            total_cpus=int(kv.get("TotalCPUs", 0)),
            gpus=_gpus(tres),
            tres=tres,
            max_mem_per_node_mb=_int_or_none(kv.get("MaxMemPerNode", "UNLIMITED")),
        )
    return out


DEFAULT_KEYS = {
    "partition": "cluster.partition",
    "nodes": "cluster.nodes",
    "time": "cluster.time",
    "gpus_per_node": "cluster.gpus_per_node",
}


def validate_request(
    partition_name: Optional[str],
    nodes: int,
    time_str: str,
    gpus_per_node: int,
    partitions: Union[Mapping[str, PartitionInfo], Sequence[PartitionInfo]],
    keys: Optional[Mapping[str, str]] = None,
) -> list[str]:
    """One-line errors (key, value, fix) for a request this cluster's partitions cannot take."""
    k = {**DEFAULT_KEYS, **(keys or {})}
    parts = dict(partitions) if isinstance(partitions, Mapping) else {p.name: p for p in partitions}
    known = ", ".join(parts) or "(none)"
    part = _requested_partition(partition_name, parts)
    if part is None:  # nothing else can be checked without the partition
        why = (
            "not set and the cluster has no default partition"
            if partition_name is None
            else f"unknown partition {partition_name!r}"
        )
        return [f"{k['partition']}: {why}; set {k['partition']} to one of: {known}"]
    errors, p = [], part.name
    if part.state in {"INACTIVE", "DRAIN"}:
        errors.append(
            f"{k['partition']}: partition {p!r} is {part.state} and takes no jobs; "
            f"pick another of: {known}"
        )
    limit = min(n for n in (part.total_nodes, part.max_nodes) if n is not None)
    if nodes < 1:
        errors.append(f"{k['nodes']}: {nodes} nodes; ask for at least 1")
    elif nodes > limit:
        errors.append(
            f"{k['nodes']}: {nodes} nodes exceed partition {p!r} ({limit} at most); "
            f"set {k['nodes']}<={limit} or pick a bigger partition"
        )
    errors += _time_errors(time_str, part, k["time"])
    if gpus_per_node > 0 and part.gpus == 0:
        errors.append(
            f"{k['gpus_per_node']}: {gpus_per_node} GPUs per node, but partition {p!r} "
            f"has no GPUs; set {k['gpus_per_node']}=0 or pick a GPU partition"
        )
    elif gpus_per_node > part.gpus_per_node > 0:
        errors.append(
            f"{k['gpus_per_node']}: {gpus_per_node} GPUs per node, but partition {p!r} "
            f"has {part.gpus_per_node}; set {k['gpus_per_node']}<={part.gpus_per_node}"
        )
    return errors


def _requested_partition(
    name: Optional[str], parts: Mapping[str, PartitionInfo]
) -> Optional[PartitionInfo]:
    """The named partition, else (no name) the cluster's first default; None when there is none."""
    if name is None:
        return next((p for p in parts.values() if p.default), None)
    return parts.get(name)


def _time_errors(time_str: str, part: PartitionInfo, key: str) -> list[str]:
    """A time Slurm cannot read, or one above the partition's MaxTime (UNLIMITED is above any)."""
    try:
        secs = parse_time(time_str)
    except ValueError as exc:
        return [f"{key}: {exc}"]
    if part.max_time_s is not None and (secs is None or secs > part.max_time_s):
        most = format_time(part.max_time_s)
        return [
            f"{key}: {time_str!r} exceeds partition {part.name!r} MaxTime {most}; "
            f"set {key}<={most} or pick another partition"
        ]
    return []


def slurmd_timeout_s(show_config: str) -> Optional[int]:
    """SlurmdTimeout from `scontrol show config` (`SlurmdTimeout = 300 sec`), None if absent."""
    m = re.search(r"^SlurmdTimeout\s*=\s*(\d+)", show_config, re.M)
    return int(m.group(1)) if m else None
