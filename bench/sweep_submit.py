"""Time until every point of a 64-point sweep is queued: slurmtrain's array vs Hydra's submitit launcher.

    python bench/sweep_submit.py [--points 64]

Needs the local cluster (tools/slurm_cluster.py start). Jobs are submitted held (`--hold`), so
nothing runs; both are cancelled afterwards. Hydra's launcher blocks until its jobs end, so its
figure is the time until squeue shows all its jobs (polled every 0.1 s), then it is stopped;
slurmtrain's is the time until its command has returned (and squeue shows all its jobs).

Rounds are interleaved and alternate which side goes first (a shared machine's load and warm
caches favour neither); medians are printed. The CPU seconds each command used (with the
sbatch/git/scontrol it ran; not the bench's own squeue polls) are printed too: on a busy shared
machine they vary less than wall time.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def queued(name: str) -> int:
    out = subprocess.run(
        ["squeue", "-h", "-r", "-n", name, "-o", "%i"], capture_output=True, text=True
    ).stdout
    return len(out.split())


def sweep(points: int) -> str:
    return "optim.lr=" + ",".join(f"{1e-4 * (i + 1):.6g}" for i in range(points))


def _cpu(pid: int) -> tuple[int, float]:
    """Reap a child: its exit status and the CPU seconds it and its reaped children used."""
    _, status, usage = os.wait4(pid, 0)
    return status, usage.ru_utime + usage.ru_stime


def ours(points: int, workdir: Path) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurmtrain",
            "-m",
            "cluster=slurm",
            "name=benchours",
            f"runs_root={workdir}",
            "+cluster.sbatch_extra.hold=true",
            sweep(points),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    err = proc.stderr.read() if proc.stderr else b""
    status, cpu = _cpu(proc.pid)
    elapsed = time.perf_counter() - t0
    if status:
        raise RuntimeError(f"slurmtrain's sweep failed ({status}): {err.decode()[-2000:]}")
    assert queued("st-benchours") == points, queued("st-benchours")
    return elapsed, cpu


def hydras(points: int, workdir: Path) -> tuple[float, float]:
    cmd = [
        sys.executable,
        "-m",
        "slurmtrain",
        "-m",
        "hydra/launcher=submitit_slurm",
        f"hydra.sweep.dir={workdir}/hydra",
        "hydra.launcher.name=benchhydra",
        "+hydra.launcher.additional_parameters.hold=true",
        "hydra.launcher.timeout_min=10",
        f"runs_root={workdir}",
        sweep(points),
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    while queued("benchhydra") < points:
        if proc.poll() is not None and queued("benchhydra") < points:
            raise RuntimeError("Hydra's submitit launcher exited before queueing the sweep")
        time.sleep(0.1)
    elapsed = time.perf_counter() - t0
    os.killpg(proc.pid, signal.SIGTERM)
    _, cpu = _cpu(proc.pid)
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians printed")
    args = parser.parse_args()
    ours_s: list[float] = []
    theirs_s: list[float] = []
    ours_cpu: list[float] = []
    theirs_cpu: list[float] = []
    for i in range(args.rounds):  # interleaved: a busy machine slows both alike
        sides = [("ours", ours), ("theirs", hydras)]
        for name, run in sides if i % 2 == 0 else sides[::-1]:  # who goes first alternates
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    wall, cpu = run(args.points, Path(tmp))
                finally:
                    subprocess.run(["scancel", "-n", "st-benchours"])
                    subprocess.run(["scancel", "-n", "benchhydra"])
            (ours_s if name == "ours" else theirs_s).append(wall)
            (ours_cpu if name == "ours" else theirs_cpu).append(cpu)
    t_ours, t_hydra = statistics.median(ours_s), statistics.median(theirs_s)
    c_ours, c_hydra = statistics.median(ours_cpu), statistics.median(theirs_cpu)
    print(
        f"rounds: slurmtrain {' '.join(f'{t:.2f}' for t in ours_s)} s | Hydra submitit launcher "
        f"{' '.join(f'{t:.2f}' for t in theirs_s)} s"
    )
    print(
        f"CPU seconds (median): slurmtrain {c_ours:.2f} | Hydra submitit launcher {c_hydra:.2f} "
        f"| ratio {c_hydra / c_ours:.2f}"
    )
    print(
        f"{args.points}-point sweep, time until all queued (median of {args.rounds}): slurmtrain "
        f"{t_ours:.2f} s (one array, returns at once) | Hydra submitit launcher {t_hydra:.2f} s "
        f"(then blocks until the jobs end) | ratio {t_hydra / t_ours:.2f} (goal >= 1.0)"
    )


if __name__ == "__main__":
    main()
