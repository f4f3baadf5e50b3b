"""Restart cost in node count: what one restart asks of the shared tier, at 2 and 16 nodes.

    python bench/restart_ops.py [--nodes 2,16] [--keep] [--stage-env]

On the local cluster's `big` partition (one CPU rank per node, gloo) a tiny-OPT run checkpoints at
step 2 and crashes at step 3; the batch script restarts it inside the job and it resumes from step
2. Every rank runs with SLURMTRAIN_COUNT_IO=1 (compute/io_count.py): from its first line to its
first step it counts files it reads under the run directory, metadata calls there (stat, listdir,
scandir, glob), bytes it reads there, and torch.distributed collectives (rendezvous round trips).
The restart's counts (the second attempt: a new job, no spare) are printed per operation at each size, with wall times.

`--stage-env` runs the ranks from each node's copy of the environment (cluster.stage_env): the
count of files opened there shows the imports no longer come from the shared one.

The measure is the per-rank figure: the most any one rank does, and the total over ranks divided
by the ranks (one rank a node here, so per rank is per node). A restart is flat in node count when
neither grows from 2 to 16 nodes: 16/2 <= 1.1. Per rank, not the total: the total grows with the
nodes even when each node's work is fixed (each node reads its own shards: that is the job's
size, not overhead); what must not grow is any one rank's work (rank 0 reading every rank's file)
or every rank reading N of anything (each rank listing all shards). The max catches the first,
the mean the second. Wall times beside them are noise on 2 cores shared by 16 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurmtrain.common.events import CheckpointLoaded, Finished, Started, Stopped  # noqa: E402
from slurmtrain.common.rundir import RunDir  # noqa: E402
from slurmtrain.compute.io_count import OPS  # noqa: E402

ARGS = [
    "cluster=slurm",
    "cluster.partition=big",
    "faults.health_check=false",  # a storage probe per node: the gate's cost, not the restart's
    "faults.spare_nodes=0",
    "faults.successor=false",  # the crash's resubmission is the restart measured; no singleton
    "faults.allow_inject=true",
    "train.log_interval=1",
    "train.max_steps=4",
    "checkpoint.interval_steps=2",
]
INJECT = "crash_at_step=3,attempts=1"
PACKS = Path("/tmp/slurmtrain-test-env-packs")


def big_idle() -> bool:
    out = subprocess.run(
        ["sinfo", "-h", "-p", "big", "-o", "%t %D"], capture_output=True, text=True
    ).stdout.split()
    return out[:1] == ["idle"] and len(out) == 2


def drill(workdir: Path, nodes: int, stage: list[str], timeout: float = 900) -> dict[str, Any]:
    """One run at `nodes` nodes through its crash and restart; its counts and times."""
    deadline = time.time() + timeout
    while not big_idle() and time.time() < deadline:
        time.sleep(2)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SLURMTRAIN_COUNT_IO": "1",
        "SLURMTRAIN_INJECT": INJECT,
    }
    name = f"restartops{nodes}-{int(time.time()) % 100000}"  # no job name shared with old runs
    cmd = [sys.executable, "-m", "slurmtrain", *ARGS, *stage, f"nodes={nodes}", f"name={name}"]
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"submit failed at {nodes} nodes:\n{done.stdout}\n{done.stderr}")
    [run] = sorted(p.parent for p in (workdir / "runs" / name).glob("*/config.yaml"))
    while time.time() < deadline:
        rows = RunDir(run).events()
        if any(isinstance(e, (Finished, Stopped)) for e in rows):
            break
        time.sleep(3)
    else:
        raise SystemExit(f"{nodes} nodes: no finish in {timeout:.0f} s ({run})")
    started = [e for e in rows if isinstance(e, Started)]
    loaded = [e for e in rows if isinstance(e, CheckpointLoaded) and e.attempt == 2]
    if not loaded:
        raise SystemExit(f"{nodes} nodes: the restart loaded no checkpoint ({run})")
    restarts = sorted((run / "io_count").iterdir(), key=lambda d: d.stat().st_mtime)
    if len(started) < 2 or len(restarts) < 2:
        raise SystemExit(f"{nodes} nodes: no restart ({run}: {[d.name for d in restarts]})")
    per_rank = [json.loads(p.read_text()) for p in sorted(restarts[-1].glob("rank*.json"))]
    fresh = [json.loads(p.read_text()) for p in sorted(restarts[0].glob("rank*.json"))]
    return {
        "nodes": nodes,
        "run": str(run),
        "ranks": per_rank,
        "fresh": fresh,
        "restart_s": started[1].time - started[0].time,
        "startup_s": _startup_s(rows, started[1].attempt or 0),
    }


def _startup_s(rows: list[Any], attempt: int) -> float:
    """The restart's own start-up (its `startup` row: exec to first step), seconds."""
    from slurmtrain.common.events import Startup

    got = [e.seconds for e in rows if isinstance(e, Startup) and e.attempt == attempt]
    return float(got[0] or 0.0) if got else float("nan")


def summary(ranks: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per operation: (max over ranks, mean over ranks)."""
    return {op: (max(r[op] for r in ranks), sum(r[op] for r in ranks) / len(ranks)) for op in OPS}


def show(results: list[dict[str, Any]]) -> None:
    print("restart (attempt 2) per rank, exec to first step; one rank per node, gloo/CPU")
    print(f"{'operation':>14} " + " ".join(f"{r['nodes']:>9} max {'mean':>9}" for r in results))
    sums = [summary(r["ranks"]) for r in results]
    for op in OPS:
        print(f"{op:>14} " + " ".join(f"{s[op][0]:>13.0f} {s[op][1]:>9.1f}" for s in sums))
    small, big = sums[0], sums[-1]
    a, b = results[0]["nodes"], results[-1]["nodes"]
    print(f"ratio {b}/{a} per rank (goal <= 1.1), max and mean over ranks:")
    worst = 0.0
    for op in OPS:
        rmax, rmean = (big[op][i] / small[op][i] if small[op][i] else 1.0 for i in (0, 1))
        if op != "files_written":  # writes: the restart's own rows and shards, not reads
            worst = max(worst, rmax, rmean)
        print(f"{op:>14}  max {rmax:5.2f}  mean {rmean:5.2f}")
    print(f"worst read-side ratio {b}/{a}: {worst:.2f} ({'ok' if worst <= 1.1 else 'over 1.1'})")
    print("wall (noise on 2 cores): " + ", ".join(
        f"{r['nodes']} nodes: start-up {r['startup_s']:.1f} s, crash to restart's start "
        f"{r['restart_s']:.1f} s" for r in results))  # fmt: skip
    rank0 = results[-1]["ranks"][0]
    print(f"{b} nodes, rank 0's shared-tier reads: {json.dumps(rank0['read_paths'])}")
    other = results[-1]["ranks"][-1]
    print(f"{b} nodes, rank {other['rank']}'s: {json.dumps(other['read_paths'])}")
    staged = sum(r["env_staged"] for r in results[-1]["ranks"])
    opened = sum(r["env_files"] for r in results[-1]["ranks"])
    print(f"files opened outside the run dir, {b} nodes: {opened}, {staged} of them node-local")
    print(f"modules from: {json.dumps(other['env_dirs'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="2,16", help="comma-separated sizes, smallest first")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--stage-env",
        action="store_true",
        help="cluster.stage_env=true: modules from each node's copy (~1 GB a node on this disk)",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="restart_ops."))
    stage = [
        "cluster.stage_env=true",
        f"cluster.stage_env_dir={workdir}/node-local",
        f"cluster.stage_env_cache={PACKS}",  # the cluster tests' packs, cached by the venv's hash
    ]
    try:
        sizes = [int(n) for n in args.nodes.split(",")]
        results = [drill(workdir, n, stage if args.stage_env else []) for n in sizes]
        show(results)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    finally:
        if args.keep:
            print(f"runs kept under {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
