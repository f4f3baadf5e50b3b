"""Recovery latency after a time-limit signal: USR2 -> first training step of the next attempt.

    python bench/recovery_latency.py [--resubmit-only]

Needs the local cluster. Runs the same 2-node job twice, side by side: slurmtrain's default restart
(faults.restart=resubmit: a new job id starts at once) and the `scontrol requeue` path that
submitit's own USR2 handler takes (same job id; Slurm holds a requeued job for cred_expire, 120 s by
default, 10 s on the local test cluster). Figures come from each run's ledger and metrics; the
phases of the resumed attempt from its `startup` row (compute/startup.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from metric_fields import integer, number  # noqa: E402

from slurmtrain.batch.successor import job_name  # noqa: E402
from slurmtrain.common import events  # noqa: E402
from slurmtrain.common.events import Rows  # noqa: E402


def measure(restart: str, workdir: Path) -> tuple[float, float, dict[str, float]]:
    from slurmtrain.common.jsonl import read_jsonl
    from slurmtrain.common.rundir import RunDir

    name = f"recovery-{restart}"
    env = dict(os.environ, SLURMTRAIN_INJECT="step_delay=0.8")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmtrain",
            "cluster=slurm",
            "nodes=2",
            f"name={name}",
            f"runs_root={workdir}",
            "cluster.time=2",
            "cluster.signal_lead_s=30",
            "train.max_steps=100",
            "train.log_interval=1",
            f"faults.restart={restart}",
            "faults.allow_inject=true",  # SLURMTRAIN_INJECT's step_delay: opted in
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    run = next((workdir / name).glob("*/config.yaml")).parent
    deadline = time.time() + 600
    while time.time() < deadline:
        got = timings(RunDir(run).events(), read_jsonl(run / "metrics.jsonl"))
        if got is not None:
            # the run's own name (faults.successor: st-NAME-FP8; its pending successor too)
            subprocess.run(["scancel", "-n", f"st-{name},{job_name(name, run)}"])
            return got
        time.sleep(1)
    raise RuntimeError(f"{restart}: no second attempt within 10 minutes")


def timings(
    ledger: Rows, metrics: list[dict[str, object]]
) -> Optional[tuple[float, float, dict[str, float]]]:
    """(signal -> next attempt started, -> its first step, start-up phases), once the attempt
    after the time-limit signal has started and trained; else None."""
    # the ranks' row of the time-limit signal (a batch-shell row has no received_at)
    signal = next((e for e in ledger if isinstance(e, events.Signal) and e.received_at), None)
    if signal is None or signal.received_at is None:
        return None
    t0, resumed = signal.received_at, signal.attempt
    assert resumed is not None, signal  # the ranks' rows name their attempt
    resumed += 1
    after = [m for m in metrics if integer(m, "attempt") == resumed]
    started = [e for e in ledger if isinstance(e, events.Started) and e.attempt == resumed]
    startup = [e for e in ledger if isinstance(e, events.Startup) and e.attempt == resumed]
    if not (after and started and startup):
        return None
    # The way from the signal to the next process: save, supervisor, sbatch, Slurm, srun.
    began = startup[0].process_started_at or 0.0
    between = [e for e in ledger if t0 <= e.time <= began and e is not signal]
    phases = {f"  +{e.event}": e.time - t0 for e in between}
    phases["USR2 -> process start"] = began - t0
    laid_out = startup[0].phases or {}  # compute/startup.py: phase -> seconds
    phases.update({str(k): number(laid_out, k) for k in laid_out})
    return started[0].time - t0, number(after[0], "time") - t0, phases


def main() -> None:
    only = "--resubmit-only" in sys.argv  # the goal's figure alone (half the time)
    # the cancelled jobs may still be writing their logs while the folder goes
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        ours = measure("resubmit", Path(tmp))
        requeue = None if only else measure("requeue", Path(tmp))
    print("USR2 -> next attempt started / first step of the next attempt:")
    print(f"  slurmtrain (resubmit)          {ours[0]:6.1f} s / {ours[1]:6.1f} s  (goal <= 10 s)")
    if requeue is not None:
        print(
            f"  scontrol requeue (submitit's)  {requeue[0]:6.1f} s / {requeue[1]:6.1f} s  "
            f"(cred_expire here: see `scontrol show config | grep AuthInfo`)"
        )
    print("the resumed attempt's start-up (slurmtrain, resubmit), seconds:")
    for phase, seconds in ours[2].items():
        print(f"  {phase:<24}{seconds:6.2f}")


if __name__ == "__main__":
    main()
