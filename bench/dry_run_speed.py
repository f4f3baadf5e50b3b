"""How long the README's headline dry run takes, beside what any Python start costs on this machine.

    python bench/dry_run_speed.py [--runs 9] [--] [OVERRIDE ...]

Runs `python -m slurmtrain model=opt13b nodes=64 gpus_per_node=8 dry_run=true` (or the overrides
given) --runs times and prints the median and fastest wall time and CPU time (user + system, this
process's children included: the Slurm commands it runs), with the same figures for `python -c
pass` and `python -c "import hydra"` (the floor every Hydra command pays). On Slurm (cluster=auto
finds it) the dry run also waits for `scontrol` and `sbatch --test-only`. The goal is 0.5 s; on a
machine other people load, the fastest run and the CPU time say more than the median, so the load
average is printed too. A figure, not a test: nothing here fails.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADLINE = ["model=opt13b", "nodes=64", "gpus_per_node=8", "dry_run=true"]


def timed(cmd: list[str], runs: int) -> tuple[list[float], list[float], int]:
    """(wall seconds, CPU seconds, last exit code) of `runs` runs of cmd."""
    walls, cpus, code = [], [], 0
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        code = done.returncode
        if code not in (0, 2):  # 2: the dry run says a real submission would be refused
            sys.exit(f"dry_run_speed: {' '.join(cmd)} exited {code}:\n{done.stderr.decode()}")
    return walls, cpus, code


def line(name: str, walls: list[float], cpus: list[float]) -> str:
    return (
        f"{name:<34} wall median {statistics.median(walls):.3f} s  fastest {min(walls):.3f} s  "
        f"cpu median {statistics.median(cpus):.3f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("overrides", nargs="*", default=HEADLINE)
    args = parser.parse_args()
    py = sys.executable
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    timed([py, "-m", "slurmtrain", *args.overrides], 1)  # warm the file cache and .pyc files
    rows = [
        ("python -c pass", [py, "-c", "pass"]),
        ('python -c "import hydra"', [py, "-c", "import hydra"]),
        ("python -m slurmtrain ... dry run", [py, "-m", "slurmtrain", *args.overrides]),
    ]
    for name, cmd in rows:
        walls, cpus, _ = timed(cmd, args.runs)
        print(line(name, walls, cpus), flush=True)
    print(f"dry run: python -m slurmtrain {' '.join(args.overrides)} ({args.runs} runs)")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
