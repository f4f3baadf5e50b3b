"""What the health gate's storage probe costs a node: seconds per probe of a run dir and a
checkpoint dir (the gate's two mounts), the GPU check, and the injected read-only path.

    python bench/storage_probe_cost.py [DIR] [--checkpoint-dir DIR] [--rounds N]

Prints one line per measurement: median and max seconds over the rounds (the issue's bound is
2 s per node), and the rates the probe saw.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

from slurmtrain.common import gpu_health, storage_probe


def timed(fn: Callable[[], object], rounds: int) -> list[float]:
    out: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def line(what: str, seconds: list[float]) -> str:
    return f"{what}: median {statistics.median(seconds):.3f} s, max {max(seconds):.3f} s"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir", nargs="?", default=None)
    p.add_argument("--checkpoint-dir", default=None, help="default: DIR (one filesystem)")
    p.add_argument("--rounds", type=int, default=10)
    a = p.parse_args()
    base = Path(a.dir or tempfile.mkdtemp(prefix="probe-cost-"))
    mounts = [("run dir", base), ("checkpoint dir", Path(a.checkpoint_dir or base))]
    plan = storage_probe.Rates(1000.0, 2000.0)  # faults.io_*_mb_per_s defaults
    reports: list[storage_probe.MountReport] = []

    def probe() -> None:
        reports[:] = storage_probe.probe_mounts(mounts, plan)

    print(line(f"storage probe ({base}, 2 mounts)", timed(probe, a.rounds)))
    w = [r.write_mb_per_s for r in reports if r.write_mb_per_s]
    print(f"  last probe: write {w[0]:,.0f} MB/s, read {reports[0].read_mb_per_s:,.0f} MB/s")
    ro = timed(lambda: storage_probe.probe_read_only_mount(mounts, plan), a.rounds)
    print(line("injected read-only probe (unshare -m child)", ro))
    print(line("gpu check (NVML + dmesg)", timed(gpu_health.check, a.rounds)))
    print(f"  {gpu_health.check().note}")


if __name__ == "__main__":
    main()
