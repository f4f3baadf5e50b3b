"""Restart inside the job's allocation: which healthy nodes run the next attempt, without the queue.

Why: at hundreds of nodes a run fails every few hours, and a trip through a busy queue is where the
time goes. A job that holds spare nodes with `--no-kill` (faults.spare_nodes) survives a node's
death; Slurm shrinks the allocation to the survivors and a new srun starts at once on them. So after
a node failure, hang, crash or bad node the supervisor names the next step's nodes: the previous
step's healthy nodes first (ranks keep their hosts), a spare for each failed one, the same world
size; with a `nodes` range and no spare left, fewer nodes (the universal checkpoint reshapes). When
neither works, the caller falls back to requeue/resubmit.

A failed node is seen by the step, not by waiting for Slurm: the ranks' own rows name it (device
error, health gate, a rank stuck before `started`), or its slurmd does not answer a connection
(slurm_cmd.unreachable_nodes) while Slurm has not yet marked it down.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from slurmtrain.batch import exclusions, next_job
from slurmtrain.common import events, inject_spec, ledger, slurm_cmd, slurm_text
from slurmtrain.common.derived import node_range, restarts_in_allocation
from slurmtrain.common.events import RELAUNCH_CLASSES, FailureClass, Row, Where
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig, load_run_config


@dataclass
class Relaunch:
    """The next step inside this allocation: its nodes, and what changed since the last one."""

    nodes: list[str]
    failed: list[str] = field(default_factory=list)  # left out of the step: dead, bad or suspect
    swapped_in: list[str] = field(default_factory=list)  # spares now training
    spares_left: int = 0  # healthy allocation nodes not in the step

    def write(self, path: str) -> None:
        """`HOSTLIST COUNT` for the batch script's `read -r hosts n`."""
        Path(path).write_text(f"{slurm_text.compress_hostlist(self.nodes)} {len(self.nodes)}\n")


def _drill_term_race(env: dict[str, str]) -> None:
    """`SLURMTRAIN_INJECT=relaunch_delay=S`: the relaunch decision waits up to S s for a SIGTERM
    (then goes on at once, inside KillWait), so a drill can land the TERM in the decision."""
    delay = float(inject_spec.parse(env).get("relaunch_delay") or 0)
    if delay <= 0:
        return
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        end = time.monotonic() + delay
        while not got and time.monotonic() < end:
            time.sleep(0.2)
    finally:
        signal.signal(signal.SIGTERM, previous)


def allocation_nodes(job_id: str, env: dict[str, str]) -> list[str]:
    """The job's nodes now (Slurm drops a dead node from a --no-kill allocation once it marks it
    down); the batch environment's list when scontrol cannot answer."""
    _drill_term_race(env)
    try:
        listed = slurm_cmd.job_info(job_id).get("NodeList", "")
    except slurm_text.SlurmError:
        listed = ""
    listed = listed if listed and listed != "(null)" else env.get("SLURM_JOB_NODELIST", "")
    return slurm_text.expand_hostlist(listed) if listed else []


def step_hosts(rows: Sequence[Row], attempt: Optional[int]) -> list[str]:
    """The finished step's nodes in rank order (its `started` row), empty if it never started."""
    for e in reversed(rows):
        if isinstance(e, events.Started) and attempt is not None and e.attempt == attempt:
            return list(dict.fromkeys(e.hosts))
    return []


def suspects(cls: str, named: list[str], rows: Sequence[Row], run_rows: Sequence[Row]) -> list[str]:
    """Nodes the failure points at: those the verdict named; for a crash whose real errors all
    come from one node, that node (swapped out only while a spare is at hand)."""
    if named or cls != FailureClass.crash:
        return sorted(set(named))
    real = ledger.real_errors([e for e in rows if isinstance(e, events.Failed)])
    nodes = {n for n in (ledger.row_node(e, run_rows) for e in real) if n is not None}
    return sorted(nodes) if len(nodes) == 1 else []


def plan(
    cfg: RootConfig,
    cls: str,
    allocation: list[str],
    previous: list[str],
    failed: list[str],
    excluded: list[str],
    optional: Sequence[str] = (),
) -> Optional[Relaunch]:
    """Nodes for the next attempt in this allocation, or None when it cannot hold the run.

    `failed`: nodes that must go (dead, bad); `excluded`: the run's active exclusions;
    `optional`: suspects swapped out only while enough other nodes remain."""
    if cls not in RELAUNCH_CLASSES or not restarts_in_allocation(cfg):
        return None
    low, high = node_range(cfg.nodes)
    out = set(failed) | set(excluded)
    healthy = [n for n in allocation if n not in out]
    want = min(len(previous) or high, high)
    spare_ok = [n for n in healthy if n not in optional]
    if len(spare_ok) >= want:
        healthy = spare_ok  # drop the suspects too: there is room without them
    if len(healthy) < low:
        return None
    count = min(want, len(healthy))
    ordered = [n for n in previous if n in healthy] + [n for n in healthy if n not in previous]
    chosen = ordered[:count]
    gone = [n for n in previous if n not in chosen]
    return Relaunch(
        nodes=chosen,
        failed=sorted(gone),
        swapped_in=[n for n in chosen if n not in previous],
        spares_left=len(healthy) - count,
    )


def abandon(run_dir: str, env: dict[str, str]) -> int:
    """The batch shell got SIGTERM while the supervisor chose the next step's nodes, or after it
    and before that step's srun: no step starts in a dying job, so the run gets its successor
    here, as it would have without the relaunch: the next job after this one at the time limit,
    a requeue when preempted; a scancel is final and recorded `cancelled`. Idempotent: a
    decision already abandoned, or followed by a started step, is left alone."""
    run = RunDir(Path(run_dir).resolve())
    job_id = env.get("SLURM_JOB_ID", "")
    restart, _ = slurm_text.attempt_counters(env)
    mine = [
        e for e in run.run_events() if e.job_id == job_id and ledger.restart_count(e) == restart
    ]
    decided = [e for e in mine if isinstance(e, events.RestartedInAllocation)]
    if not decided:
        return 0
    last = decided[-1]
    after = [e for e in mine if e.time >= last.time]
    closed = (events.Started, events.RelaunchAbandoned, events.Stopped, events.Finished)
    if any(isinstance(e, closed) for e in after):
        return 0
    where = Where(
        job_id=job_id,
        attempt=last.attempt,
        nodes=list(last.nodes),
        restart=restart,
        relaunch=last.relaunch,
    )
    cls = last.reason or FailureClass.crash
    if next_job.past_time_limit(job_id):
        why = FailureClass.timed_out
    elif next_job.preempted(job_id):
        why = FailureClass.preempted
    else:  # scancel: never restarted
        run.record(events.RelaunchAbandoned(cls=FailureClass.cancelled, reason=cls), **where)
        return 0
    run.record(events.RelaunchAbandoned(cls=why, reason=cls), **where)
    cfg = load_run_config(str(run.config))
    excl = exclusions.plan(run, cfg)
    if excl.problem:
        return next_job.stop_no_nodes(run, where, excl, excl.problem)
    try:
        if why == FailureClass.preempted:  # same job id, as the supervisor requeues a preempted job
            slurm_cmd.requeue(job_id)
            new_id, how = job_id, "requeue"
        else:  # the time limit: a new job that starts once this one has ended
            new_id = next_job.restart_job(run, job_id, excl.nodes, cfg, cls, where, after=job_id)
            how = "resubmit"
    except slurm_text.SlurmError as err:
        return next_job.stop_no_nodes(run, where, excl, f"Slurm refused the restart: {err}")
    restarted = events.Requeued(
        reason=cls, new_job_id=new_id, how=how, excluded=tuple(excl.nodes), at=why
    )
    run.record(restarted, **where)
    print(f"slurmtrain: {why} during an in-allocation restart: job {job_id} -> {new_id}")
    return 0


def main(argv: Optional[list[str]] = None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # called after the TERM: finish the successor
    parser = argparse.ArgumentParser(prog="python -m slurmtrain.batch.in_allocation")
    parser.add_argument("run_dir")
    parser.add_argument("--abandoned", action="store_true", help="SIGTERM around a relaunch")
    args = parser.parse_args(argv)
    raise SystemExit(abandon(args.run_dir, dict(os.environ)) if args.abandoned else 2)


if __name__ == "__main__":
    main()
