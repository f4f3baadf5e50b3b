"""Slurm commands: the one subprocess wrapper every Slurm call goes through, and the queries built on it.

Argument lists only, never a shell string. Login node, batch shell and compute nodes all use it
(no torch import).
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence, Union

from slurmtrain.common.commands import run_cmd
from slurmtrain.common.slurm_text import (
    PartitionInfo,
    SlurmError,
    compress_hostlist,
    parse_kv,
    parse_partitions,
)


def run(args: Sequence[str], timeout: float = 60) -> str:
    """Run a Slurm command; its stdout, or SlurmError with the line that says why."""
    cmd = run_cmd(args, timeout)
    if not cmd.ok:
        raise SlurmError(f"{' '.join(args)}: {cmd.reason()}")
    return cmd.out


def query_partitions() -> dict[str, PartitionInfo]:
    return parse_partitions(run(["scontrol", "show", "partition", "-o"]))


def job_info(job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as a dict (JobState, Restarts, NodeList, EligibleTime, ...)."""
    return parse_kv(run(["scontrol", "show", "job", "-o", str(job_id)]).splitlines()[0])


def job_state(job_id: str) -> Optional[str]:
    """RUNNING, PENDING, COMPLETED, ...: from squeue while Slurm holds the job, else sacct."""
    try:
        out = run(["squeue", "-h", "-j", str(job_id), "-o", "%T"]).split()
        if out:
            return out[0]
    except SlurmError:
        pass  # "Invalid job id": the controller has forgotten it; accounting still knows
    try:
        lines = run(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State"]).split("\n")
    except SlurmError:
        return None
    states = [ln.split()[0] for ln in lines if ln.strip()]  # "CANCELLED by 0" -> CANCELLED
    return states[-1] if states else None


def is_preempted(job_id: str) -> bool:
    """True once Slurm has chosen the job for preemption (its PreemptTime is set).

    A SIGTERM with this true is a preemption, else a scancel or time limit. Slurm 22.05 requeues a
    preempted job only if it is still running when GraceTime ends: one that saves and exits first
    ends COMPLETED/FAILED, so it must `requeue` itself before exiting.
    """
    return _time_set(job_info(job_id).get("PreemptTime", "None"))


def _time_set(value: str) -> bool:
    return value not in {"None", "Unknown", "(null)", "N/A", ""}


def requeue(job_id: str) -> None:
    run(["scontrol", "requeue", str(job_id)])


def start_now(job_id: str) -> None:
    """Lift the requeue delay (a requeued job waits AuthInfo cred_expire, 120 s by default)."""
    run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])


def exclude_nodes(job_id: str, nodes: Union[str, Iterable[str]]) -> None:
    """Keep a pending job off some nodes (e.g. one that failed the health gate)."""
    hostlist = nodes if isinstance(nodes, str) else compress_hostlist(nodes)
    run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={hostlist}"])


def down_nodes(nodes: list[str]) -> list[str]:
    """Nodes of this job that Slurm sees as down or not responding."""
    if not nodes:
        return []
    try:
        out = run(["sinfo", "-h", "-N", "-n", compress_hostlist(nodes), "-o", "%N %t"])
    except SlurmError:
        return []
    bad = []
    for line in out.splitlines():
        name, state = (line.split() + [""])[:2]
        if state.endswith("*") or state.startswith(("down", "drain", "fail")):
            bad.append(name)
    return sorted(set(bad))
