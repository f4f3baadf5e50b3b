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
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

from slurmtrain.common import errors, slurm_cmd
from slurmtrain.common import ledger as faults
from slurmtrain.common import slurm_text as slurm
from slurmtrain.common.rundir import RunDir, read_jsonl  # read_jsonl: bad_nodes.jsonl
from slurmtrain.common.schema import load_run_config

EXIT_STOPPED = 1  # the batch script's code when a run stops past a budget: the job is FAILED


def _attempt(events: list[dict[str, Any]], job_id: str) -> Optional[int]:
    started = [e for e in events if e["event"] == "started" and str(e.get("job_id")) == job_id]
    return started[-1]["attempt"] if started else None


def _effective_rc(rc: int, events: list[dict[str, Any]], attempt: Optional[int]) -> int:
    """What the attempt meant to exit with. After a collective stop every rank exits with the same
    code, but srun --kill-on-bad-exit may kill the slower ranks first, so srun's own code can be
    a signal's; the ledger's `signal` event says what really happened."""
    signals = [
        e.get("signal") for e in events if e["event"] == "signal" and e.get("attempt") == attempt
    ]
    if "SIGTERM" in signals:
        return errors.EXIT_TERMINATED
    if "SIGUSR2" in signals:
        return errors.EXIT_REQUEUE
    return rc


def _preempted(job_id: str) -> bool:
    try:
        return slurm_cmd.is_preempted(job_id)
    except slurm.SlurmError:
        return False


def classify(
    rc: int, events: list[dict[str, Any]], attempt: Optional[int], nodes: list[str], wait_s: float
) -> tuple[str, list[str]]:
    """(failure class, nodes that failed) for a job step that exited with `rc` != 0."""
    if rc in faults.EXIT_CLASS:
        return faults.EXIT_CLASS[rc], []
    failed = [e for e in events if e["event"] == "failed" and e.get("attempt") == attempt]
    hung = [e for e in failed if e.get("class") == faults.HANG]
    if hung:
        return faults.HANG, []
    if not failed or faults.is_peer_error(failed):
        # Nobody raised a real error: a peer or node died. Give Slurm time to notice.
        deadline = time.time() + wait_s
        while True:
            down = slurm_cmd.down_nodes(nodes)
            if down or time.time() >= deadline:
                break
            time.sleep(2)
        if down:
            return faults.NODE_FAILURE, down
    classes = [e.get("class") for e in failed if e.get("class")]
    return (classes[0] if classes else faults.CRASH), []


def supervise(run_dir: str, rc: int, env: dict[str, str]) -> int:
    run = RunDir(Path(run_dir).resolve())
    cfg = load_run_config(str(run.config))
    job_id = env.get("SLURM_JOB_ID", "")
    nodes = (
        slurm.expand_hostlist(env["SLURM_JOB_NODELIST"]) if env.get("SLURM_JOB_NODELIST") else []
    )
    events = run.events()
    attempt = _attempt(events, job_id)
    closing = [
        e["event"]
        for e in events
        if e["event"] in ("finished", "stopped") and e.get("attempt") == attempt
    ]
    if closing:
        # Stopped by a budget: exit non-zero, or `--dependency=afterok` on this job (the big job
        # of a smoke chain) would start after a run that failed.
        return EXIT_STOPPED if "stopped" in closing else 0
    if faults.cancelled_since(
        events, job_id, attempt
    ):  # `cli cancel`: never restart what a user stopped
        run.record(
            "attempt_ended",
            job_id=job_id,
            attempt=attempt,
            nodes=nodes,
            **{"class": "cancelled", "exit_code": rc},
        )
        return 0
    rc = _effective_rc(rc, events, attempt)
    if rc == 0:
        return 0
    record = dict(job_id=job_id, attempt=attempt, nodes=nodes)
    if rc == errors.EXIT_TERMINATED:
        # Slurm 22.05 requeues a preempted job only if it outlives GraceTime; ours saved and exited
        # first, so it requeues itself (same job id: no second copy can appear). A scancel is final.
        if not _preempted(job_id):
            run.record("attempt_ended", **record, **{"class": "cancelled", "exit_code": rc})
            return 0
        run.record("attempt_ended", **record, **{"class": faults.PREEMPTED, "exit_code": rc})
        if faults.over_budget(run.events(), cfg.faults) is not None:
            run.record(
                "stopped",
                **record,
                **{"class": faults.PREEMPTED, "error": "preemption budget exhausted"},
            )
            return EXIT_STOPPED
        slurm_cmd.requeue(job_id)
        run.record("requeued", **record, reason=faults.PREEMPTED, new_job_id=job_id, how="requeue")
        return 0
    cls, lost = classify(rc, events, attempt, nodes, float(cfg.faults.node_check_s))
    steps = [
        e.get("step") for e in events if e["event"] == "failed" and e.get("attempt") == attempt
    ]
    run.record(
        "attempt_ended",
        **record,
        **{"class": cls, "exit_code": rc, "step": next((s for s in steps if s is not None), None)},
    )
    for node in lost:
        run.record("node_lost", **record, node=node)
    events = run.events()
    stop = faults.over_budget(events, cfg.faults)
    if stop is not None or cls == faults.CONFIG_ERROR:
        error = faults.last_error(events, attempt) or f"exit code {rc}"
        run.record("stopped", **record, **{"class": stop or cls, "error": error})
        print(
            f"slurmtrain: stopping the run: {stop or cls} budget exhausted; last error: {error}",
            file=sys.stderr,
        )
        return rc
    bad = bad_nodes(run)
    try:
        new_id = restart(run, job_id, bad, cfg, cls)
    except slurm.SlurmError as err:
        print(f"slurmtrain: restart of job {job_id} failed: {err}", file=sys.stderr)
        return rc
    run.record(
        "requeued",
        **record,
        reason=cls,
        excluded=bad,
        new_job_id=new_id,
        how="requeue" if new_id == job_id else "resubmit",
    )
    if new_id != job_id:
        run.record(
            "submitted",
            job_id=new_id,
            executor="slurm",
            fingerprint=run.path.name,
            requeue_of=job_id,
        )
    print(
        f"slurmtrain: restart of job {job_id} -> {new_id} ({cls}); excluded: "
        f"{','.join(bad) or 'none'}",
        file=sys.stderr,
    )
    return 0


def restart(run: RunDir, job_id: str, bad: list[str], cfg: Any, cls: str) -> str:
    """Start the next attempt; returns its job id.

    After a node failure Slurm may requeue this very job itself once the node is declared down;
    `scontrol requeue` of the same id makes a second copy impossible, so it is used there."""
    if cfg.cluster.exclude:  # a command-line --exclude replaces the script's: keep the user's too
        bad = sorted(set(bad) | set(slurm.expand_hostlist(cfg.cluster.exclude)))
    if cfg.faults.restart == "requeue" or cls == faults.NODE_FAILURE and not bad:
        slurm_cmd.requeue(job_id)
        if bad:
            slurm_cmd.exclude_nodes(job_id, bad)
        return job_id
    # retried on transient errors without ever queueing a second copy (slurm_cmd.sbatch)
    args = [f"--exclude={slurm.compress_hostlist(bad)}"] if bad else []
    return slurm_cmd.sbatch(args, str(run.sbatch))


def bad_nodes(run: RunDir) -> list[str]:
    """Nodes the health gate failed (the bad-node ledger); stragglers are only advisory."""
    rows = read_jsonl(run.bad_nodes)
    return sorted({r["node"] for r in rows if r.get("reason") != "straggler" and r.get("node")})


def main(argv: Optional[list[str]] = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m slurmtrain.batch.supervise")
    parser.add_argument("run_dir")
    parser.add_argument("--rc", type=int, required=True, help="exit code of the srun step")
    args = parser.parse_args(argv)
    raise SystemExit(supervise(args.run_dir, args.rc, dict(os.environ)))


if __name__ == "__main__":
    main()
