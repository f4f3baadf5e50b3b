"""Tensor-parallelism drill on the local Slurm cluster (tools/slurm_cluster.py start): prints figures.

`parallel.tensor=2` on 2 nodes x 2 CPU tasks (TP 2 x DP 2, each TP pair on one node), crashed in
step 7 (a checkpoint every 5 steps; the supervisor restarts it), paused at step 10, then resumed on
1 node x 2 tasks (TP 2 x DP 1: DeepSpeed's universal checkpoint, the global batch kept, grad
accumulation 2 -> 4) to step 20; against a TP=1 run of the same global batch on 2 local ranks.
Prints the largest loss difference per phase and the ledger's crash / convert / load rows.

    python bench/tp_drill.py [WORKDIR]      # ~5 min on this 2-core machine
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurmtrain.common import events  # noqa: E402
from slurmtrain.common.events import Row, Rows  # noqa: E402
from slurmtrain.common.rundir import RunDir  # noqa: E402


def run_cli(
    args: list[str], cwd: Path, env: Optional[dict[str, str]] = None
) -> subprocess.CompletedProcess[str]:
    """`python -m slurmtrain ARGS` as a user runs it (tests/conftest.py's, without pytest)."""
    full = {**os.environ, "SLURMTRAIN_AUTO": "off", **(env or {})}
    full["PYTHONPATH"] = str(ROOT) + os.pathsep + full.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "slurmtrain", *args]
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=600)


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/*/config.yaml"))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


COMMON = [
    "train.max_steps=20",
    "train.log_interval=1",
    "train.global_batch_size=8",
    "train.micro_batch_size=2",
    "checkpoint.interval_steps=5",
    "cluster.cpu_tasks_per_node=2",
    "gpus_per_node=0",
]


def wait(run: Path, kind: type[Row], timeout: float = 900) -> Rows:
    start = time.time()
    print(f"tp_drill: waiting for {kind.kind!r} in {run}", flush=True)
    while time.time() - start < timeout:
        rows = RunDir(run).events() if (run / "config.yaml").exists() else []
        if any(isinstance(r, kind) for r in rows):
            return rows
        time.sleep(2)
    raise SystemExit(f"tp_drill: no {kind.kind!r} in {run} after {timeout:.0f} s")


def job_gone(job_id: str, timeout: float = 300) -> None:
    """The paused job's batch shell still runs its supervisor after `paused` is written: until it
    leaves the queue a submission finds the run running and queues nothing (as it must)."""
    start = time.time()
    while time.time() - start < timeout:
        queued = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True)
        if not queued.stdout.strip():
            return
        time.sleep(1)
    raise SystemExit(f"tp_drill: job {job_id} still queued after {timeout:.0f} s")


# The rows the drill prints: the attempts, the crash, the conversion and load, the end.
SHOWN = (
    events.Started,
    events.Failed,
    events.CheckpointConverted,
    events.CheckpointLoaded,
    events.Finished,
)
KEEP = ("event", "attempt", "world_size", "step", "from_world_size", "to_world_size", "class")


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_jsonl(run / "metrics.jsonl")}  # newest per step


def main(work: Path) -> int:
    ref = run_cli(COMMON + ["cluster=local", "name=tp_drill_ref"], cwd=work)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    tp = COMMON + ["cluster=slurm", "parallel.tensor=2", "name=tp_drill"]
    first = run_cli(
        tp + ["nodes=2", "train.pause_at_step=10", "faults.allow_inject=true"],
        cwd=work,
        env={"SLURMTRAIN_INJECT": "crash_at_step=7,attempts=1"},
    )
    assert first.returncode == 0, first.stdout + first.stderr
    run = next(p for p in run_dirs(work / "runs") if p.parent.name == "tp_drill")
    paused = wait(run, events.Paused)
    job_gone(str([e for e in paused if isinstance(e, events.Paused)][-1].job_id))
    second = run_cli(tp + ["nodes=1"], cwd=work)
    assert second.returncode == 0, second.stdout + second.stderr
    rows = wait(run, events.Finished)
    want, got = (
        losses(next(p for p in run_dirs(work / "runs") if p.parent.name == "tp_drill_ref")),
        losses(run),
    )
    assert sorted(got) == list(range(1, 21)), sorted(got)
    for label, steps in (
        ("2 nodes x 2, TP 2 x DP 2", range(1, 11)),
        ("1 node x 2, TP 2 x DP 1", range(11, 21)),
    ):
        worst = max(abs(got[s] - want[s]) for s in steps)
        print(
            f"tp_drill: steps {steps.start}-{steps.stop - 1} ({label}) vs TP=1: max |loss diff| {worst:.2e}"
        )
    for r in rows:
        if isinstance(r, SHOWN):
            shown = r.to_json()
            print("tp_drill:", {k: shown[k] for k in KEEP if k in shown})
    return 0


if __name__ == "__main__":
    sys.exit(
        main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="tp_drill_")))
    )
