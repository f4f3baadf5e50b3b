"""Slurm commands: the one subprocess wrapper every Slurm call goes through, and queries built on it.

Argument lists only, never a shell string; no torch (login node, batch shell and compute nodes).
A controller that restarts or is overloaded answers "Unable to contact slurm controller" (or
nothing) for minutes, and a run must not stop for that: `run` retries such transient errors with
backoff up to `SLURMTRAIN_SLURM_RETRY_S` (180 s); a definite answer is never retried. A timed-out
sbatch may have queued its job, so `sbatch()` tags each submission with a unique `--comment` and
asks squeue for it before trying again.
"""

from __future__ import annotations

import getpass
import os
import socket
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Iterable, Optional, Sequence, Union

from slurmtrain.common.commands import Cmd, run_cmd
from slurmtrain.common.slurm_text import (
    PartitionInfo,
    SlurmError,
    compress_hostlist,
    parse_kv,
    parse_partitions,
)

RETRY_ENV = "SLURMTRAIN_SLURM_RETRY_S"
DEFAULT_RETRY_S = 180.0
FIRST_DELAY_S, MAX_DELAY_S = 1.0, 30.0
# Said by Slurm's clients when the controller cannot be reached (restart, failover, overload).
TRANSIENT = (
    "socket timed out",
    "unable to contact slurm controller",
    "slurm_load_jobs error: unable to contact",
    "unable to contact",
    "transport endpoint",
    "connection refused",
    "connection reset",
    "zero bytes were transmitted or received",
    "communication connection failure",
    "resource temporarily unavailable",
    "slurm temporarily unable to accept job",
    "backup controller in standby mode",
    "no answer within",  # our own timeout (rc 124)
)
# Definite answers: the controller was reached and said no. They win over any transient phrase.
DEFINITE = (
    "invalid job id",
    "invalid partition",
    "invalid account",
    "invalid qos",
    "invalid node name",
    "invalid user",
    "invalid job array",
    "access/permission denied",
    "requested node configuration is not available",
    "unrecognized option",
    "invalid option",
)


def transient(cmd: Cmd) -> bool:
    """Whether a failed Slurm command may succeed if asked again (the controller was not reached)."""
    if cmd.rc in (126, 127):  # cannot run the program at all
        return False
    text = f"{cmd.err}\n{cmd.out}".lower()
    if any(d in text for d in DEFINITE):
        return False
    return cmd.rc == 124 or any(t in text for t in TRANSIENT)


def retry_budget(retry_s: Optional[float] = None) -> float:
    if retry_s is not None:
        return max(0.0, float(retry_s))
    try:
        return max(0.0, float(os.environ.get(RETRY_ENV, DEFAULT_RETRY_S)))
    except ValueError:
        return DEFAULT_RETRY_S


def _retrying(args: Sequence[str], cmd: Cmd, delay: float) -> None:
    print(
        f"slurmtrain: {' '.join(args[:3])}: {cmd.reason()}; transient, retrying in {delay:g} s",
        file=sys.stderr,
    )


def run(args: Sequence[str], timeout: float = 60, retry_s: Optional[float] = None) -> str:
    """Run a Slurm command; its stdout, or SlurmError with the line that says why. Transient errors
    are retried with backoff for up to `retry_s` seconds in all (default: $SLURMTRAIN_SLURM_RETRY_S
    or 180 s); a submitting `sbatch` is tried once (use `sbatch()` to retry it safely)."""
    once = args[0] == "sbatch" and "--test-only" not in args
    deadline = time.monotonic() + (0.0 if once else retry_budget(retry_s))
    delay = FIRST_DELAY_S
    while True:
        cmd = run_cmd(args, timeout)
        if cmd.ok:
            return cmd.out
        if not transient(cmd) or time.monotonic() + delay > deadline:
            raise SlurmError(f"{' '.join(args)}: {cmd.reason()}")
        _retrying(args, cmd, delay)
        time.sleep(delay)
        delay = min(delay * 2, MAX_DELAY_S)


def sbatch(
    args: Sequence[str], script: str, timeout: float = 60, retry_s: Optional[float] = None
) -> str:
    """Submit `script` (with sbatch `args`); the job id. Transient errors are retried without ever
    queueing a second copy: each try carries the same unique `--comment` token, and before trying
    again squeue is asked (itself with retries) whether a job with that token is already queued;
    when squeue cannot say before the deadline, SlurmError, never a blind second sbatch."""
    token = f"slurmtrain-submit-{uuid.uuid4().hex[:16]}"
    tag = script_comment(script)  # the run's tag: a command-line --comment replaces the script's
    token = f"{tag} {token}" if tag else token
    argv = ["sbatch", "--parsable", f"--comment={token}", *args, script]
    deadline = time.monotonic() + retry_budget(retry_s)
    delay = FIRST_DELAY_S
    while True:
        cmd = run_cmd(argv, timeout)
        if cmd.ok:
            return cmd.out.strip().split(";")[0]
        if not transient(cmd):
            raise SlurmError(f"sbatch {script}: {cmd.reason()}")
        left = deadline - time.monotonic()
        try:
            queued = job_by_comment(token, retry_s=max(0.0, left))
        except SlurmError as err:
            raise SlurmError(
                f"sbatch {script}: {cmd.reason()}; whether it was queued is unknown "
                f"(squeue: {err}); not submitted again, to avoid a second job"
            ) from err
        if queued:
            return queued
        if time.monotonic() + delay > deadline:
            raise SlurmError(f"sbatch {script}: {cmd.reason()} (gave up after retries)")
        _retrying(argv, cmd, delay)
        time.sleep(delay)
        delay = min(delay * 2, MAX_DELAY_S)


def script_comment(script: str) -> str:
    """The `#SBATCH --comment=` of a batch script's header (its run's tag), or ""."""
    try:
        with open(script) as f:
            for line in f:
                if line.startswith("#SBATCH --comment="):  # "TAG USER-COMMENT": quoted
                    return line.split("=", 1)[1].strip().strip('"')
                if line.strip() and not line.startswith("#"):
                    break  # sbatch reads no #SBATCH line after the first command
    except OSError:
        pass
    return ""


def job_by_comment(token: str, retry_s: Optional[float] = None) -> Optional[str]:
    """The id of this user's job whose comment is `token` (any state squeue still shows), or None."""
    out = run(
        ["squeue", "-h", "-t", "all", "-u", getpass.getuser(), "-o", "%i|%k"], retry_s=retry_s
    )
    for line in out.splitlines():
        job, _, comment = line.strip().partition("|")
        if comment.strip() == token:
            return job.strip()
    return None


def query_partitions() -> dict[str, PartitionInfo]:
    return parse_partitions(run(["scontrol", "show", "partition", "-o"]))


def job_info(job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as a dict (JobState, Restarts, NodeList, EligibleTime, ...)."""
    return parse_kv(run(["scontrol", "show", "job", "-o", str(job_id)]).splitlines()[0])


def job_state(job_id: str, strict: bool = False) -> Optional[str]:
    """RUNNING, PENDING, COMPLETED, ...: from squeue while Slurm holds the job, else sacct; None
    when neither knows it. `strict`: SlurmError instead of None when neither could be asked (for
    callers that must fail closed, e.g. "is another job training this run?")."""
    answered = False  # squeue said the job is not in the queue (empty, or "Invalid job id")
    try:
        out = run(["squeue", "-h", "-j", str(job_id), "-o", "%T"]).split()
        if out:
            return out[0]
        answered = True
    except SlurmError as err:  # "Invalid job id": the controller has forgotten it; sacct knows
        answered = "invalid job id" in str(err).lower()
    try:
        lines = run(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State"]).split("\n")
    except SlurmError:
        if strict and not answered:
            raise
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
    """`scontrol requeue`; a retry after a lost answer may find the job already requeued (pending
    again): that is the wanted outcome, not an error."""
    try:
        run(["scontrol", "requeue", str(job_id)])
    except SlurmError:
        if job_state(job_id) in {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}:
            return
        raise


def start_now(job_id: str) -> None:
    """Lift the requeue delay (a requeued job waits AuthInfo cred_expire, 120 s by default)."""
    run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])


def exclude_nodes(job_id: str, nodes: Union[str, Iterable[str]]) -> None:
    """Keep a pending job off some nodes (e.g. one that failed the health gate)."""
    hostlist = nodes if isinstance(nodes, str) else compress_hostlist(nodes)
    run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={hostlist}"])


PROBE_WORKERS = 64  # concurrent TCP connects: bounds threads and open sockets at any node count
PROBE_DEADLINE_S = 30.0  # all probes of one decision, whatever the node count
POLL_FIRST_S, POLL_MAX_S = 2.0, 30.0


def poll_delays(wait_s: float) -> list[float]:
    """The sleeps between a failure decision's Slurm polls: 2, 4, 8, 16, then 30 s, the last cut
    so they sum to `wait_s`. Calls = len + 1 = ceil((wait_s - 30) / 30) + 5 past 30 s: 6 at 45 s,
    15 at the default 330 s (SlurmdTimeout 300 + 30); a fixed 2 s period made 166 there."""
    delays: list[float] = []
    left, delay = float(wait_s), POLL_FIRST_S
    while left > 0:
        delays.append(min(delay, left))
        left -= delays[-1]
        delay = min(delay * 2, POLL_MAX_S)
    return delays


def _accepts(addr: str, port: int, timeout_s: float) -> bool:
    try:
        socket.create_connection((addr, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def unreachable_nodes(
    nodes: list[str], timeout_s: float = 3.0, deadline_s: float = PROBE_DEADLINE_S
) -> list[str]:
    """Nodes whose slurmd does not accept a connection now: a dead node is seen at once, not
    after SlurmdTimeout (when Slurm itself marks it down). Empty when Slurm cannot be asked.

    Cost: one `scontrol show node -o HOSTLIST` for all nodes, then one TCP connect per node,
    PROBE_WORKERS at a time (a live slurmd answers in milliseconds, a dead host takes timeout_s):
    512 dead hosts take 8 rounds x 3 s = 24 s, not 512 x 3 s. A probe not done by `deadline_s`
    names no node (Slurm's own down-marking is the fallback)."""
    if not nodes:
        return []
    try:
        out = run(["scontrol", "show", "node", "-o", compress_hostlist(nodes)])
    except SlurmError:
        return []
    targets = []
    for line in out.splitlines():
        info = parse_kv(line)
        name, addr = info.get("NodeName"), info.get("NodeAddr") or info.get("NodeHostName")
        if name and addr:
            port = int(info["Port"]) if info.get("Port", "").isdigit() else 6818
            targets.append((name, addr, port))
    return probe_slurmds(targets, timeout_s, deadline_s)


def probe_slurmds(
    targets: list[tuple[str, str, int]], timeout_s: float, deadline_s: float
) -> list[str]:
    """Names of the (name, addr, port) targets that refuse or time out a TCP connect, probed
    PROBE_WORKERS at a time; a probe not done by `deadline_s` names nothing."""
    if not targets:
        return []
    pool = ThreadPoolExecutor(max_workers=min(PROBE_WORKERS, len(targets)))
    futures = {pool.submit(_accepts, addr, port, timeout_s): name for name, addr, port in targets}
    done, _ = wait(futures, timeout=deadline_s)
    pool.shutdown(wait=False, cancel_futures=True)  # stragglers end by their own timeout
    return sorted(futures[f] for f in done if not f.result())


def down_nodes(nodes: list[str], retry_s: Optional[float] = None) -> list[str]:
    """Nodes of this job that Slurm sees as down or not responding: one `sinfo -N -n HOSTLIST`
    for all of them (`retry_s`: transient errors' budget, as in `run`)."""
    if not nodes:
        return []
    try:
        out = run(
            ["sinfo", "-h", "-N", "-n", compress_hostlist(nodes), "-o", "%N %t"], retry_s=retry_s
        )
    except SlurmError:
        return []
    bad = []
    for line in out.splitlines():
        name, state = (line.split() + [""])[:2]
        if state.endswith("*") or state.startswith(("down", "drain", "fail")):
            bad.append(name)
    return sorted(set(bad))
