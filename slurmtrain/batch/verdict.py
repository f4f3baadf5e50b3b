"""How one attempt ended, from the ledger and Slurm: the supervisor's classification.

slurmtrain.batch.supervise reads an attempt (`attempt_view`) and judges it (`judge`): its class, the
nodes it names and those to exclude. Apart from the supervisor so that tools and drills can ask for
a verdict (`verdict_of`) without the restart that follows it. Light: no torch import.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from slurmtrain.batch import in_allocation
from slurmtrain.common import errors, events, ledger, slurm_cmd, slurm_text
from slurmtrain.common.events import FailureClass, Row, Rows
from slurmtrain.common.jsonl import merge_rows
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig
from slurmtrain.planning import deadlines


@dataclass
class Verdict:
    """How an attempt ended: its class, the nodes named, and those to exclude (node -> reason)."""

    cls: str
    nodes: list[str] = field(default_factory=list)
    exclude: dict[str, str] = field(default_factory=dict)


def _effective_rc(rc: int, rows: Sequence[Row]) -> int:
    """What the attempt meant to exit with. After a collective stop every rank exits with the same
    code, but srun --kill-on-bad-exit may kill the slower ranks first, so srun's own code can be
    a signal's; the ledger's `signal` and `bad_node` events say what really happened."""
    signals = [e.signal for e in rows if isinstance(e, events.Signal)]
    if "SIGTERM" in signals:
        return errors.EXIT_TERMINATED
    if "SIGUSR2" in signals:
        return errors.EXIT_REQUEUE
    if rc and any(isinstance(e, events.BadNode) for e in rows):
        return errors.EXIT_BAD_NODE  # the health gate failed a node: no wait for Slurm to see it
    return rc


def _nodes_of(rows: Sequence[Row], run_rows: Sequence[Row]) -> list[str]:
    return sorted({n for n in (ledger.row_node(e, run_rows) for e in rows) if n})


def never_joined(hung: Sequence[events.Failed]) -> list[str]:
    """The step's nodes none of whose ranks had joined the rendezvous when the first rank gave up
    waiting: a node wedged in start-up or dead. Its ranks may write rows later (Slurm's SIGCONT and
    SIGTERM at the kill wake a stopped one), so a row counts only if it joined in time. When no
    rank joined in time, the cause is not one node's (a shared filesystem, say): none is named."""
    waiting = [e for e in hung if e.phase == deadlines.RENDEZVOUS and e.step_nodes]
    if not waiting:
        return []
    gave_up = min(e.time for e in waiting)
    joined = {str(e.host) for e in waiting if e.arrived_at is not None and e.arrived_at <= gave_up}
    step_nodes = {n for e in waiting for n in e.step_nodes}
    return sorted(step_nodes - joined) if joined else []


def node_check_s(cfg: RootConfig) -> float:
    """How long to wait for Slurm to mark a dead node down: faults.node_check_s, or (0) this
    cluster's SlurmdTimeout + 30 s."""
    if cfg.faults.node_check_s > 0:
        return float(cfg.faults.node_check_s)
    try:
        timeout = slurm_text.slurmd_timeout_s(slurm_cmd.run(["scontrol", "show", "config"]))
    except slurm_text.SlurmError:
        timeout = None
    return float((timeout if timeout is not None else 300) + 30)


def _poll_down(nodes: list[str], wait_s: float) -> list[str]:
    """Nodes Slurm marks down within `wait_s`: one `sinfo` for all of them per poll, polls spaced
    2, 4, 8, 16, then 30 s (slurm_cmd.poll_delays): 15 calls at the default 330 s, 6 at 45 s.
    A poll meeting a transient error is not retried in place: the next poll is its retry."""
    if not nodes:
        return []
    down = slurm_cmd.down_nodes(nodes, retry_s=0)
    for delay in slurm_cmd.poll_delays(wait_s):
        if down:
            break
        time.sleep(delay)
        down = slurm_cmd.down_nodes(nodes, retry_s=0)
    return down


def classify(
    rc: int,
    failed: Sequence[events.Failed],
    run_rows: Sequence[Row],
    nodes: list[str],
    wait_s: float,
    started: bool = True,
    probe: bool = False,
) -> Verdict:
    """The verdict on a job step that exited with `rc` != 0, from its ranks' `failed` rows.

    The rows decide first (ledger.classify: exit code, OOM, device error, a real error); this
    adds the nodes to name and exclude: an OOM's nodes (named, not excluded), a device error's
    (excluded), a hang before `started` the stuck ranks' nodes, or a rendezvous that timed out
    the step's nodes none of whose ranks joined it.

    Slurm calls for an unexplained failure (no real error, the costliest decision): with `probe`,
    one `scontrol show node` plus a TCP connect per node (64 at a time, 30 s at most); then at most
    len(poll_delays(wait_s)) + 1 `sinfo` calls, each naming every node (15 at wait_s = 330 s).
    Other classes make none. The caller adds one `scontrol show config` when
    faults.node_check_s is 0."""
    found = ledger.classify(failed, rc)
    if found.cls == FailureClass.oom:
        return Verdict(found.cls, _nodes_of(found.rows, run_rows))
    if found.cls == FailureClass.node_failure and found.rows:
        named = _nodes_of(found.rows, run_rows)
        first = found.rows[0]
        error = first.error if isinstance(first, events.Failed) else ""
        why = error.strip().splitlines()[-1:] or ["device error"]
        return Verdict(found.cls, named, {n: f"device error: {why[0][:200]}" for n in named})
    if found.cls is not None:
        return Verdict(found.cls)
    hung = [e for e in failed if e.cls == FailureClass.hang]
    if hung or rc == errors.EXIT_HANG:
        if started:
            return Verdict(FailureClass.hang)
        named = _nodes_of(hung, run_rows)
        if named:
            return Verdict(FailureClass.hang, named, {n: "hang before started" for n in named})
        absent = never_joined(hung)
        reason = "its ranks never joined the rendezvous"
        return Verdict(FailureClass.hang, absent, {n: reason for n in absent})
    # Nobody raised a real error: a peer or node died. Ask its slurmd (`probe`), or give Slurm
    # time to notice.
    dead = slurm_cmd.unreachable_nodes(nodes) if probe else []
    if dead:  # excluded like a bad node: the next job must not land on it before Slurm sees it
        return Verdict(FailureClass.node_failure, dead, {n: "slurmd unreachable" for n in dead})
    down = _poll_down(nodes, wait_s)
    if down:
        return Verdict(FailureClass.node_failure, down)
    classes = [e.cls for e in failed if e.cls]
    return Verdict(classes[0] if classes else FailureClass.crash)


@dataclass
class AttemptView:
    """What the supervisor reads to judge one attempt: the run tier and this attempt key's rank
    rows (`events`, time order), the attempt number (None: it never recorded `started`), its
    rows, and its rank rows alone (`rank`). O(attempts + nodes) files, never every rank's rows of
    every attempt."""

    events: Rows
    attempt: Optional[int]
    rows: Rows
    rank: Rows


def attempt_view(run: RunDir, job_id: str, restart: int, relaunch: int) -> AttemptView:
    rank = run.rank_rows(job_id, restart, relaunch)
    run_rows = merge_rows([run.run_events(), rank])
    attempt = ledger.attempt_of(run_rows, job_id, restart, relaunch)
    rows = ledger.attempt_rows(run_rows, job_id, restart, attempt, relaunch)
    return AttemptView(run_rows, attempt, rows, rank)


def verdict_of(
    run: RunDir, job_id: str, restart: int, relaunch: int, rc: int, nodes: list[str], wait_s: float
) -> Verdict:
    """The supervisor's classification of one attempt from the ledger (no budget, no restart):
    what `supervise` decides for a failed step, for tools and drills."""
    return judge(attempt_view(run, job_id, restart, relaunch), rc, nodes, wait_s)


def judge(
    view: AttemptView, rc: int, nodes: list[str], wait_s: float, probe: bool = False
) -> Verdict:
    """classify() on what `attempt_view` read: the attempt's `failed` rows and its step's hosts."""
    failed = [e for e in view.rows if isinstance(e, events.Failed)]
    hosts = in_allocation.step_hosts(view.events, view.attempt) or nodes
    return classify(rc, failed, view.events, hosts, wait_s, view.attempt is not None, probe)
