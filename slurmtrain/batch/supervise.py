"""The batch shell's supervisor: `python -m slurmtrain.batch.supervise RUN_DIR --rc CODE` after srun.

Why in the batch shell: it runs outside any container (scontrol is there), once per attempt, after
every rank has exited, so it sees the attempt's real outcome. It classifies the exit, records
`attempt_ended`, and within the failure budgets starts the next attempt; past a budget it records
`stopped`. Light on purpose: no torch import.

Next attempt, `faults.restart`:
- `resubmit` (default): `sbatch job.sbatch` (new job id, bad nodes excluded), then this job ends.
  Measured here: `scontrol requeue` + `StartTime=now` restarts the job at once, but on a node that
  ran it within `cred_expire` (120 s by default) slurmd refuses it ("Job credential revoked") and the
  job ends FAILED; without lifting, the requeued job waits 121 s. A new job id has neither problem.
- `requeue`: `scontrol requeue` (same job id, Slurm's own restart count), paying the site's delay.

An attempt is (job id, SLURM_RESTART_COUNT): a start that died before `started` gets its own
`attempt_ended` (class crash, `before_started`), never the previous start's outcome. Slurm's
SIGTERM reaches the batch shell too (time limit, scancel, preemption): the script traps it and this
process ignores it, so the restart still happens; a new job is submitted held, recorded, then
released, so it never starts before the ledger knows it (compute/faults/owner.py checks that).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from slurmtrain.batch import exclusions, in_allocation, next_job
from slurmtrain.common import errors, slurm_cmd
from slurmtrain.common import ledger as faults
from slurmtrain.common import slurm_text as slurm
from slurmtrain.common.jsonl import merge_rows
from slurmtrain.common.rundir import RunDir, append_jsonl
from slurmtrain.common.schema import load_run_config, restarts_in_allocation
from slurmtrain.planning import deadlines as phases

EXIT_STOPPED = next_job.EXIT_STOPPED


@dataclass
class Verdict:
    """How an attempt ended: its class, the nodes named, and those to exclude (node -> reason)."""

    cls: str
    nodes: list[str] = field(default_factory=list)
    exclude: dict[str, str] = field(default_factory=dict)


def _effective_rc(rc: int, rows: list[dict[str, Any]]) -> int:
    """What the attempt meant to exit with. After a collective stop every rank exits with the same
    code, but srun --kill-on-bad-exit may kill the slower ranks first, so srun's own code can be
    a signal's; the ledger's `signal` and `bad_node` events say what really happened."""
    signals = [e.get("signal") for e in rows if e["event"] == "signal"]
    if "SIGTERM" in signals:
        return errors.EXIT_TERMINATED
    if "SIGUSR2" in signals:
        return errors.EXIT_REQUEUE
    if rc and any(e["event"] == "bad_node" for e in rows):
        return errors.EXIT_BAD_NODE  # the health gate failed a node: no wait for Slurm to see it
    return rc


def _nodes_of(rows: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[str]:
    return sorted({n for n in (faults.row_node(e, events) for e in rows) if n})


def never_joined(hung: list[dict[str, Any]]) -> list[str]:
    """The step's nodes none of whose ranks had joined the rendezvous when the first rank gave up
    waiting: a node wedged in start-up or dead. Its ranks may write rows later (Slurm's SIGCONT and
    SIGTERM at the kill wake a stopped one), so a row counts only if it joined in time. When no
    rank joined in time, the cause is not one node's (a shared filesystem, say): none is named."""
    waiting = [e for e in hung if e.get("phase") == phases.RENDEZVOUS and e.get("step_nodes")]
    if not waiting:
        return []
    gave_up = min(float(e.get("time") or 0) for e in waiting)
    joined = {
        str(e.get("host"))
        for e in waiting
        if e.get("arrived_at") is not None and float(e["arrived_at"]) <= gave_up
    }
    step_nodes = {str(n) for e in waiting for n in e["step_nodes"]}
    return sorted(step_nodes - joined) if joined else []


def node_check_s(cfg: Any) -> float:
    """How long to wait for Slurm to mark a dead node down: faults.node_check_s, or (0) this
    cluster's SlurmdTimeout + 30 s."""
    if cfg.faults.node_check_s > 0:
        return float(cfg.faults.node_check_s)
    try:
        timeout = slurm.slurmd_timeout_s(slurm_cmd.run(["scontrol", "show", "config"]))
    except slurm.SlurmError:
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
    failed: list[dict[str, Any]],
    events: list[dict[str, Any]],
    nodes: list[str],
    wait_s: float,
    started: bool = True,
    probe: bool = False,
) -> Verdict:
    """The verdict on a job step that exited with `rc` != 0, from its ranks' `failed` rows.

    A real error outranks hang rows and peers' communication errors: an OOM is `oom` (node and
    step named, not excluded); a local CUDA/NCCL/ECC error is a node failure of the node that
    recorded it (excluded); a hang before `started` is attributed to the stuck ranks' nodes, and
    a rendezvous that timed out to the step's nodes none of whose ranks joined it.

    Slurm calls for an unexplained failure (no real error, the costliest decision): with `probe`,
    one `scontrol show node` plus a TCP connect per node (64 at a time, 30 s at most); then at most
    len(poll_delays(wait_s)) + 1 `sinfo` calls, each naming every node (15 at wait_s = 330 s).
    Other classes make none. The caller adds one `scontrol show config` when
    faults.node_check_s is 0."""
    if rc in faults.EXIT_CLASS and rc != errors.EXIT_HANG:
        return Verdict(faults.EXIT_CLASS[rc])
    real = faults.real_errors(failed)
    oom = [e for e in real if faults.is_oom(e)]
    if oom:
        return Verdict(faults.OOM, _nodes_of(oom, events))
    device = [e for e in real if faults.is_device_error(e)]
    if device:
        named = _nodes_of(device, events)
        why = str(device[0].get("error", "")).strip().splitlines()[-1:] or ["device error"]
        return Verdict(
            faults.NODE_FAILURE, named, {n: f"device error: {why[0][:200]}" for n in named}
        )
    if real:
        return Verdict(real[0].get("class") or faults.CRASH)
    hung = [e for e in failed if e.get("class") == faults.HANG]
    if hung or rc == errors.EXIT_HANG:
        if started:
            return Verdict(faults.HANG)
        named = _nodes_of(hung, events)
        if named:
            return Verdict(faults.HANG, named, {n: "hang before started" for n in named})
        absent = never_joined(hung)
        return Verdict(
            faults.HANG, absent, {n: "its ranks never joined the rendezvous" for n in absent}
        )
    # Nobody raised a real error: a peer or node died. Ask its slurmd (`probe`), or give Slurm
    # time to notice.
    dead = slurm_cmd.unreachable_nodes(nodes) if probe else []
    if dead:  # excluded like a bad node: the next job must not land on it before Slurm sees it
        return Verdict(faults.NODE_FAILURE, dead, {n: "slurmd unreachable" for n in dead})
    down = _poll_down(nodes, wait_s)
    if down:
        return Verdict(faults.NODE_FAILURE, down)
    classes = [e.get("class") for e in failed if e.get("class")]
    return Verdict(classes[0] if classes else faults.CRASH)


@dataclass
class AttemptView:
    """What the supervisor reads to judge one attempt: the run tier and this attempt key's rank
    rows (`events`, time order), the attempt number (None: it never recorded `started`), its
    rows, and its rank rows alone (`rank`). O(attempts + nodes) files, never every rank's rows of
    every attempt."""

    events: list[dict[str, Any]]
    attempt: Optional[int]
    rows: list[dict[str, Any]]
    rank: list[dict[str, Any]]


def attempt_view(run: RunDir, job_id: str, restart: int, relaunch: int) -> AttemptView:
    rank = run.rank_rows(job_id, restart, relaunch)
    events = merge_rows([run.run_events(), rank])
    attempt = faults.attempt_of(events, job_id, restart, relaunch)
    rows = faults.attempt_rows(events, job_id, restart, attempt, relaunch)
    return AttemptView(events, attempt, rows, rank)


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
    failed = [e for e in view.rows if e["event"] == "failed"]
    hosts = in_allocation.step_hosts(view.events, view.attempt) or nodes
    return classify(rc, failed, view.events, hosts, wait_s, view.attempt is not None, probe)


def supervise(
    run_dir: str,
    rc: int,
    env: dict[str, str],
    terminated: bool = False,
    relaunch_file: Optional[str] = None,
) -> int:
    """Decide what the step's exit means and start the next attempt. Returns the batch script's
    exit code; EXIT_RELAUNCH (with the nodes in `relaunch_file`) runs the next attempt in this
    allocation."""
    run = RunDir(Path(run_dir).resolve())
    cfg = load_run_config(str(run.config))
    job_id = env.get("SLURM_JOB_ID", "")
    restart = int(env.get("SLURM_RESTART_COUNT") or 0)
    relaunch = int(env.get("SLURMTRAIN_RELAUNCH") or 0)
    nodes = (
        slurm.expand_hostlist(env["SLURM_JOB_NODELIST"]) if env.get("SLURM_JOB_NODELIST") else []
    )
    if rc == errors.EXIT_DUPLICATE:  # another live job owns the run: leave it alone
        print(f"slurmtrain: job {job_id} did not train {run.path}: another job holds it")
        return 0
    view = attempt_view(run, job_id, restart, relaunch)
    events, attempt, rows = view.events, view.attempt, view.rows
    closing = [e["event"] for e in rows if e["event"] in ("finished", "stopped")]
    if attempt is not None and closing:
        # Stopped by a budget: exit non-zero, or `--dependency=afterok` on this job (the big job
        # of a smoke chain) would start after a run that failed.
        return EXIT_STOPPED if "stopped" in closing else 0
    record = dict(job_id=job_id, attempt=attempt, nodes=nodes, restart=restart, relaunch=relaunch)
    if attempt is not None and any(e["event"] == "attempt_ended" for e in rows):
        return 0  # closed already: by on_sigterm's early restart, or by `cli cancel`
    if faults.cancelled_since(events, job_id, attempt):  # `cli cancel`: never restart it
        run.record("attempt_ended", **record, **{"class": faults.CANCELLED, "exit_code": rc})
        return 0
    rc = _effective_rc(rc, rows)
    if rc == 0:
        return 0
    if terminated and rc != errors.EXIT_TERMINATED and next_job.past_time_limit(job_id):
        rc = errors.EXIT_REQUEUE  # the time limit struck mid-save: still a time-limit restart
    if rc == errors.EXIT_TERMINATED:
        # Slurm 22.05 requeues a preempted job only if it outlives GraceTime; ours saved and exited
        # first, so it requeues itself (same job id: no second copy can appear). A scancel is final.
        if not next_job.preempted(job_id):
            run.record("attempt_ended", **record, **{"class": faults.CANCELLED, "exit_code": rc})
            return 0
        run.record("attempt_ended", **record, **{"class": faults.PREEMPTED, "exit_code": rc})
        if faults.over_budget(run.run_events(), cfg.faults) is not None:
            run.record(
                "stopped",
                **record,
                **{"class": faults.PREEMPTED, "error": "preemption budget exhausted"},
            )
            return EXIT_STOPPED
        slurm_cmd.requeue(job_id)
        run.record("requeued", **record, reason=faults.PREEMPTED, new_job_id=job_id, how="requeue")
        return 0
    failed = [e for e in rows if e["event"] == "failed"]
    # In-allocation: a dead node is found by probing its slurmd now, not by waiting for Slurm.
    inside = relaunch_file is not None and restarts_in_allocation(cfg) and not terminated
    hosts = in_allocation.step_hosts(events, attempt) or nodes  # the step's nodes
    verdict = judge(view, rc, hosts, 0.0 if inside else node_check_s(cfg), probe=inside)
    cls = verdict.cls
    steps = [e.get("step") for e in failed]
    extra: dict[str, Any] = {"before_started": True} if attempt is None else {}
    if verdict.nodes and cls != faults.NODE_FAILURE:
        extra["failed_nodes"] = verdict.nodes
    run.record(
        "attempt_ended",
        **record,
        **{"class": cls, "exit_code": rc, "step": next((s for s in steps if s is not None), None)},
        **extra,
    )
    lost = verdict.nodes if cls == faults.NODE_FAILURE else []
    for node in lost:
        run.record("node_lost", **record, node=node)
    for node, reason in verdict.exclude.items():
        append_jsonl(
            run.bad_nodes,
            {
                "node": node,
                "reason": reason,
                "time": time.time(),
                "attempt": attempt,
                "job_id": job_id,
                "restart": restart,  # a requeued job keeps its id: this tells its attempts apart
                "relaunch": relaunch,
            },
            durable=True,
        )
    events = merge_rows([run.run_events(), view.rank])  # with what was just recorded
    stop = faults.over_budget(events, cfg.faults)
    if stop is not None or cls == faults.CONFIG_ERROR:
        error = _last_error(events, rows) or f"exit code {rc}"
        run.record("stopped", **record, **{"class": stop or cls, "error": error})
        print(
            f"slurmtrain: stopping the run: {stop or cls} budget exhausted; last error: {error}",
            file=sys.stderr,
        )
        return rc
    excl = exclusions.plan(run, cfg)
    if inside:
        step = in_allocation.plan(
            cfg,
            cls,
            in_allocation.allocation_nodes(job_id, env),
            hosts,
            failed=sorted(set(lost) | set(verdict.exclude)),
            excluded=excl.nodes,
            optional=in_allocation.suspects(cls, verdict.nodes, rows, events),
        )
        if step is not None:
            assert relaunch_file is not None
            step.write(relaunch_file)
            run.record(
                "restarted_in_allocation",
                **record,
                reason=cls,
                left_out=step.failed,
                swapped_in=step.swapped_in,
                step_nodes=step.nodes,
                spares_left=step.spares_left,
            )
            print(
                f"slurmtrain: {cls}: next attempt inside job {job_id} on "
                f"{slurm.compress_hostlist(step.nodes)} (left out: "
                f"{', '.join(step.failed) or 'none'}; spares left: {step.spares_left})",
                file=sys.stderr,
            )
            return errors.EXIT_RELAUNCH
    if excl.problem:
        return next_job.stop_no_nodes(run, record, excl, excl.problem)
    try:
        new_id = next_job.restart_job(run, job_id, excl.nodes, cfg, cls, record)
    except slurm.SlurmError as err:
        print(f"slurmtrain: restart of job {job_id} failed: {err}", file=sys.stderr)
        return next_job.stop_no_nodes(run, record, excl, f"Slurm refused the restart: {err}")
    run.record(
        "requeued",
        **record,
        reason=cls,
        excluded=excl.nodes,
        exclusions_dropped=excl.dropped,
        new_job_id=new_id,
        how="requeue" if new_id == job_id else "resubmit",
    )
    print(
        f"slurmtrain: restart of job {job_id} -> {new_id} ({cls}); excluded: "
        f"{excl.describe() or 'none'}",
        file=sys.stderr,
    )
    return 0


def _last_error(events: list[dict[str, Any]], rows: list[dict[str, Any]]) -> Optional[str]:
    """The attempt's last real error (an all-rank failure: the one rank with a cause of its own,
    not the last of its peers' connection errors), else its last error, else the run's."""
    errs = [e for e in rows if e["event"] == "failed" and e.get("error")]
    errs = faults.real_errors(errs) or errs
    if errs:
        return str(errs[-1]["error"]).strip().splitlines()[-1]
    return faults.last_error(events, rows[0].get("attempt") if rows else None)


def main(argv: Optional[list[str]] = None) -> None:
    import argparse

    # Slurm's SIGTERM reaches the batch step's every process: finish the restart first (the
    # batch script traps it too); SIGKILL after KillWait still ends us.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parser = argparse.ArgumentParser(prog="python -m slurmtrain.batch.supervise")
    parser.add_argument("run_dir")
    parser.add_argument("--rc", type=int, required=True, help="exit code of the srun step")
    parser.add_argument(
        "--terminated", action="store_true", help="the batch shell received SIGTERM"
    )
    parser.add_argument(
        "--sigterm", action="store_true", help="called from the SIGTERM trap (time limit)"
    )
    parser.add_argument(
        "--relaunch-file",
        help="where to name the next in-allocation attempt's nodes (batch script with spares)",
    )
    args = parser.parse_args(argv)
    if args.sigterm:
        raise SystemExit(next_job.on_sigterm(args.run_dir, dict(os.environ)))
    raise SystemExit(
        supervise(args.run_dir, args.rc, dict(os.environ), args.terminated, args.relaunch_file)
    )


if __name__ == "__main__":
    main()
