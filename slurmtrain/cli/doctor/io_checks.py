"""The health gate's storage and GPU checks, run here: one row per check, every mount on it.

The gate's node lead probes the run's mounts before the model loads
(common/storage_probe.py) and reads NVML (common/gpu_health.py); the same code
runs here on the runs root (where it would be created, if it is not yet) and `--checkpoint-dir`,
so a read-only or slow mount is found on the login node, before anything is queued.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from slurmtrain.common import gpu_health, storage_probe

from .results import CheckResult, Status
from .storage import existing_ancestor

NAMES = tuple(f"io_{step}" for step in storage_probe.STEPS) + ("gpu_health",)
ADVICE = {
    "present": "create the directory, or point runs_root / checkpoint.dir at one that exists",
    "writable": "the mount is read-only or not yours: remount it, or choose another directory",
    "fsync": "the filesystem fails or stalls fsync: saves would hang; ask its administrators",
    "metadata": "metadata is slow (an overloaded NFS/Lustre server?): loads will stall",
    "throughput": "10x below the planned rate (faults.io_write_mb_per_s / io_read_mb_per_s): "
    "fix the mount, or set the rates this filesystem really has",
}


def mounts(runs_root: Path, checkpoint_dir: Optional[Path]) -> list[tuple[str, Path]]:
    """(label, directory to probe): a runs root not made yet is probed where it would be."""
    root = runs_root.expanduser().absolute()
    base = existing_ancestor(root)
    found = [("runs root" if base == root else "runs root's nearest parent", base)]
    if checkpoint_dir is not None:
        found.append(("checkpoint dir", checkpoint_dir.expanduser().absolute()))
    return found


def rows(reports: list[storage_probe.MountReport]) -> list[CheckResult]:
    """One row per probe step; a mount whose earlier step failed says so on the later rows."""
    out = []
    for step in storage_probe.STEPS:
        parts, failed, unreached = [], False, False
        for r in reports:
            seen = r.step(step)
            if seen is None:
                unreached = unreached or r.failed is not None
                why = "not reached" if r.failed else "same filesystem, timed above"
                parts.append(f"{r.label} {r.path}: {why}")
                continue
            failed = failed or not seen.ok
            parts.append(f"{r.label} {r.path}: {seen.detail}")
        status: Status = "fail" if failed else "warn" if unreached else "ok"
        advice = ADVICE[step] if failed else "fix the failed io_ row above" if unreached else ""
        out.append(CheckResult(f"io_{step}", status, "; ".join(parts), advice))
    return out


def io_checks(
    runs_root: Path, checkpoint_dir: Optional[Path], write_mb_per_s: float, read_mb_per_s: float
) -> list[CheckResult]:
    """The storage probe's rows (names NAMES[:-1]), judged against the planned rates."""
    plan = storage_probe.Rates(write_mb_per_s or None, read_mb_per_s or None)
    reports = storage_probe.probe_mounts(mounts(runs_root, checkpoint_dir), plan)
    took = sum(r.seconds for r in reports)
    checks = rows(reports)
    last = checks[-1]
    checks[-1] = CheckResult(
        last.name, last.status, f"{last.value} (probe {took:.2f} s)", last.advice
    )
    return checks


def gpu_check() -> CheckResult:
    """NVML's ECC / retired pages / throttling and the kernel log's XIDs on this machine."""
    report = gpu_health.check()
    if report.ok:
        return CheckResult("gpu_health", "ok", report.note)
    return CheckResult(
        "gpu_health", "fail", f"{report.reason}; {report.note}", "drain this node; reset the GPU"
    )
