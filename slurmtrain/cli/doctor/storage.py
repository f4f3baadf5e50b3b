"""The run root: writable, visible from compute nodes, and big enough for the planned checkpoints."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from slurmtrain.common import runlock

from .results import CheckResult

GB = 1e9
MARGIN = 1.25  # warn when the planned checkpoints would leave less than 25 % headroom


def existing_ancestor(path: Path) -> Path:
    """The path itself if it exists, else its nearest existing parent (where it would be created)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def filesystem_type(path: Path) -> str:
    """Type of the filesystem holding `path` from /proc/mounts (longest mount-point prefix); '?' if unknown."""
    best, kind = "", "?"
    target = str(path.resolve())
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(
            best
        ):
            best, kind = mount, fields[2]
    return kind


def check_run_root(root: Path, shared_marker: Optional[Path] = None) -> CheckResult:
    root = root.expanduser().absolute()
    base = existing_ancestor(root)
    fs = filesystem_type(base)
    if base == root and not root.is_dir():
        return CheckResult(
            "run_root", "fail", f"{root} exists and is not a directory", "pick another runs_root"
        )
    where = f"{root} ({fs})" if base == root else f"{root} (to be created in {base}, {fs})"
    try:
        fd, tmp = tempfile.mkstemp(prefix=".slurmtrain-doctor-", dir=base)
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        return CheckResult(
            "run_root",
            "fail",
            f"{where}: not writable ({err.strerror})",
            "choose a writable runs_root=... on a filesystem all nodes share",
        )
    if shared_marker is not None and not shared_marker.exists():
        return CheckResult(
            "run_root",
            "fail",
            f"{where}: the login node's marker file is not visible here",
            "runs_root must be on a filesystem shared by login and compute nodes (same path)",
        )
    advice = "" if shared_marker else "must be the same shared path on every node (--srun verifies)"
    kind, why = runlock.choose(base)
    where += f", run lock: {kind} ({why})"  # which lock keeps one job per run here (runlock.py)
    if fs in ("tmpfs", "ramfs"):
        return CheckResult(
            "run_root",
            "warn",
            f"{where}, writable",
            "in memory: lost at reboot and not shared with other nodes; use a shared filesystem",
        )
    return CheckResult("run_root", "ok", f"{where}, writable", advice)


def check_disk_space(root: Path, planned_gb: Optional[float]) -> CheckResult:
    base = existing_ancestor(root.expanduser().absolute())
    try:
        usage = shutil.disk_usage(base)
    except OSError as err:
        return CheckResult(
            "disk_space", "fail", f"{base}: {err.strerror}", "check the run root path"
        )
    free_gb = usage.free / GB
    value = f"{free_gb:,.1f} GB free of {usage.total / GB:,.1f} GB at {base}"
    if planned_gb is None:
        return CheckResult(
            "disk_space",
            "ok",
            value,
            "pass --planned-checkpoint-gb (kept checkpoints x size, from the plan) to compare",
        )
    value += f"; planned checkpoints {planned_gb:,.1f} GB"
    if free_gb < planned_gb:
        return CheckResult(
            "disk_space",
            "fail",
            value,
            f"short by {planned_gb - free_gb:,.1f} GB: keep fewer "
            "checkpoints (checkpoint.keep_last) or move runs_root",
        )
    if free_gb < planned_gb * MARGIN:
        return CheckResult(
            "disk_space",
            "warn",
            value,
            "less than 25 % headroom: a save in flight needs room "
            "for one more checkpoint (step_N.tmp) before the oldest is pruned",
        )
    return CheckResult("disk_space", "ok", value)


def check_setup(lines: list[str], timeout: float) -> CheckResult:
    """cluster.setup's lines run here, in one bash as the batch script runs them (each exit code
    checked): a `module load` of a module this cluster lacks fails now, not after the queue."""
    import subprocess

    if not lines:
        return CheckResult("setup", "ok", "no cluster.setup lines given (--setup LINE)")
    script = "".join(
        f'{line}\nrc=$?; [ "$rc" -eq 0 ] || {{ echo "setup line {i} exited $rc"; exit 1; }}\n'
        for i, line in enumerate(lines, 1)
    )
    try:
        done = subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return CheckResult("setup", "fail", f"did not finish in {timeout:.0f} s", "check the lines")
    if done.returncode == 0:
        return CheckResult("setup", "ok", f"{len(lines)} line(s) ran and exited 0")
    said = (done.stdout.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    err = (done.stderr.strip().splitlines() or [""])[-1][:80]
    return CheckResult(
        "setup", "fail", f"{said}: {err}".rstrip(": "), "fix the line (the job would stop there)"
    )
