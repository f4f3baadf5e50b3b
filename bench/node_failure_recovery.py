"""Node failure recovery, side by side: a hot spare (restart inside the job) vs the queue.

    python bench/node_failure_recovery.py [--trials 1]

Needs the local cluster (tools/slurm_cluster.py start --nodes 4). Each variant trains a 2-node
opt_tiny run; at step 12 rank 1's node dies (its slurmd and its rank are killed) and, at that same
moment, another job takes the cluster's free nodes for 90 s (a busy cluster: whatever goes back
through the queue waits behind it). Variants:
- spare: faults.spare_nodes=1 (the job holds 3 nodes with --no-kill; the next attempt starts inside
  the allocation with the spare in the dead node's place);
- queue: no spare (the supervisor resubmits or requeues; the new job waits for nodes).
Prints per variant: detection (kill -> attempt_ended), failure -> next attempt started (srun up,
ranks met), failure -> first resumed step (also model build and checkpoint load), steps lost, job
ids used. Goal: spare <= detection + 10 s, and never a wait on the queue.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_trial import STATE_DIR, Trial, harness, rank1, sh  # noqa: E402
from metric_fields import integer, number  # noqa: E402

from slurmtrain.common import events  # noqa: E402  (fault_trial put the repository on the path)

BLOCK_S = 90


def blocker(free: int) -> str:
    """A job on the cluster's free nodes for BLOCK_S seconds: the queue is busy from now on."""
    if free < 1:
        return ""
    out = subprocess.run(
        ["sbatch", "--parsable", "-p", "debug", f"-N{free}", "--exclusive", "--output=/dev/null"]
        + ["--job-name=st-bench-busy", "--wrap", f"sleep {BLOCK_S}"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().split(";")[0]


def free_nodes() -> int:
    out = subprocess.run(
        ["sinfo", "-h", "-p", "debug", "-t", "idle", "-o", "%D"], capture_output=True, text=True
    ).stdout.split()
    return sum(int(x) for x in out if x.isdigit())


def one(variant: str, workdir: Path, index: int) -> dict[str, Any]:
    t = Trial(workdir, f"nfr-{variant}-{index}")
    spare = ["faults.spare_nodes=1"] if variant == "spare" else []
    t.submit(["train.max_steps=40", "checkpoint.interval_steps=5", *spare], "step_delay=0.5")
    t.wait_step(12)
    started = t.of(events.Started)[-1]
    victim, rank_pid = rank1(started)
    pid = int((STATE_DIR / "run" / f"slurmd-{victim}.pid").read_text().split()[0])
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    try:
        if rank_pid is not None:
            os.kill(rank_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    busy = blocker(free_nodes())
    try:
        end = t.wait_end(timeout=900)
    finally:
        harness("start", "--nodes", "4")
        sh("scontrol", "update", f"nodename={victim}", "state=resume")
        if busy:
            sh("scancel", busy)
    failed = started.attempt
    assert failed is not None, started  # every `started` row names its attempt
    ended = [e.time for e in t.of(events.AttemptEnded) if e.attempt == failed]
    first_next = [number(m, "time") for m in t.metrics() if (integer(m, "attempt") or 0) > failed]
    next_start = [e.time for e in t.of(events.Started) if (e.attempt or 0) > failed]
    loaded = [e for e in t.of(events.CheckpointLoaded) if (e.attempt or 0) > failed]
    last_before = max(
        integer(m, "step") or 0 for m in t.metrics() if integer(m, "attempt") == failed
    )
    jobs = sorted({str(e.job_id) for e in t.of(events.Started)})

    def since_kill(times: list[float]) -> float:
        return times[0] - killed_at if times else float("nan")

    return {
        "variant": variant,
        "end": end,
        "detect_s": since_kill(ended),
        "start_s": since_kill(next_start),
        "resume_s": since_kill(first_next),
        "lost": last_before - (loaded[0].step or 0) if loaded else None,
        "jobs": jobs,
        "moved": bool(t.of(events.RestartedInAllocation)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=1)
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="nfr-") as tmp:
        for i in range(1, a.trials + 1):
            for variant in ("spare", "queue"):
                rows.append(one(variant, Path(tmp), i))
                print(rows[-1], file=sys.stderr, flush=True)
    print(f"node failure at step 12 of a 2-node run; free nodes taken for {BLOCK_S} s at the kill")
    head = (
        f"{'variant':8} {'end':9} {'detect s':>9} {'failure->next start s':>22} "
        f"{'failure->first step s':>22} {'lost':>5}  jobs"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['variant']:8} {r['end']:9} {r['detect_s']:9.1f} {r['start_s']:22.1f} "
            f"{r['resume_s']:22.1f} "
            f"{str(r['lost']):>5}  {','.join(r['jobs'])}"
            + ("  (in allocation)" if r["moved"] else "")
        )


if __name__ == "__main__":
    main()
