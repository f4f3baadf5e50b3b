"""The storage probe: is a directory the run writes to usable, and how fast, in under 2 s.

A node whose run or checkpoint mount is missing, read-only or many times slow otherwise hangs at
load until the phase deadline. One process a node (the health gate's node lead, or `doctor` on the
login node) checks each mount in order: present (a directory), writable (a file created),
`fsync` works, metadata latency (create/stat/unlink, the median of a few), and a short timed
write and read (fsync'd, then dropped from the page cache so the read reaches the filesystem).
Rates are judged against the plan's per-node rates when it has them (10x slower fails); without
them only errors fail. Pure Python (no torch): `doctor` imports it on the login node.
"""

from __future__ import annotations

import errno
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

MiB = 2**20
MB = 1e6
PROBE_BYTES = 16 * MiB  # big enough to see a 10x slow mount, small enough for < 2 s per node
CHUNK = 1 * MiB
THROUGHPUT_BUDGET_S = 0.6  # a very slow mount writes what it can in this time, then is judged
METADATA_ROUNDS = 5
METADATA_LIMIT_S = 0.5  # a create/stat/unlink slower than this stalls every rank's open at load
FSYNC_LIMIT_S = 1.0
SLOW_FACTOR = 10.0  # a probe this much slower than the plan's rate fails
STEPS = ("present", "writable", "fsync", "metadata", "throughput")
SLOW_MARK = "of the plan's"  # in a throughput failure's detail (the gate tells it from errors)


@dataclass(frozen=True)
class Rates:
    """The plan's per-node rates in MB/s (None: not known, so only errors fail)."""

    write_mb_per_s: Optional[float] = None
    read_mb_per_s: Optional[float] = None


@dataclass(frozen=True)
class Step:
    """One check of one mount: its name (STEPS), verdict and what was seen, figures included."""

    name: str
    ok: bool
    detail: str
    broken: bool = False  # an OS error, not a slow figure: trying again will not help


@dataclass
class MountReport:
    """Every step run on one mount, in order; the first failure ends it."""

    label: str  # "run dir", "checkpoint dir", "runs root"
    path: str
    steps: list[Step] = field(default_factory=list)
    seconds: float = 0.0
    write_mb_per_s: float = 0.0
    read_mb_per_s: float = 0.0
    probe_bytes: int = 0  # what the timed write got through (less on a very slow mount)

    @property
    def failed(self) -> Optional[Step]:
        return next((s for s in self.steps if not s.ok), None)

    def step(self, name: str) -> Optional[Step]:
        return next((s for s in self.steps if s.name == name), None)


def failure(reports: Sequence[MountReport]) -> Optional[str]:
    """The health gate's reason for the first failing mount, `storage: ...` (None: all pass)."""
    for r in reports:
        bad = r.failed
        if bad is not None:
            return f"storage: {r.label} {r.path}: {bad.name}: {bad.detail}"
    return None


def _why(err: OSError) -> str:
    return f"{err.strerror or err} (errno {err.errno})"


def _probe_name(path: Path) -> Path:
    """A hidden name no checkpoint reader matches (they look for step_N and `latest`)."""
    return path / f".slurmtrain-probe-{socket.gethostname()}-{os.getpid()}"


def _present(path: Path) -> Step:
    if not path.exists():
        return Step("present", False, "missing")
    if not path.is_dir():
        return Step("present", False, "not a directory")
    return Step("present", True, "a directory")


def _writable(path: Path, read_only: bool) -> tuple[Step, Optional[int]]:
    """A file created (its descriptor for the next steps), or why not."""
    try:
        if read_only:  # injected bad_storage_node where no real read-only mount can be made
            raise OSError(errno.EROFS, os.strerror(errno.EROFS) + ", simulated")
        fd = os.open(_probe_name(path), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as err:
        return Step("writable", False, f"cannot create a file: {_why(err)}"), None
    return Step("writable", True, "a file created"), fd


def _fsync(fd: int) -> Step:
    t0 = time.perf_counter()
    try:
        os.write(fd, b"\0" * 4096)
        os.fsync(fd)
    except OSError as err:
        return Step("fsync", False, f"failed: {_why(err)}")
    took = time.perf_counter() - t0
    ok = took <= FSYNC_LIMIT_S
    return Step("fsync", ok, f"{took * 1e3:.1f} ms" + ("" if ok else f" > {FSYNC_LIMIT_S:g} s"))


def _metadata(path: Path) -> Step:
    """create + stat + unlink of an empty file, the median of METADATA_ROUNDS."""
    rounds = []
    name = str(_probe_name(path)) + ".meta"
    try:
        for _ in range(METADATA_ROUNDS):
            t0 = time.perf_counter()
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o600))
            os.stat(name)
            os.unlink(name)
            rounds.append(time.perf_counter() - t0)
    except OSError as err:
        return Step("metadata", False, f"create/stat/unlink failed: {_why(err)}")
    median = statistics.median(rounds)
    ok = median <= METADATA_LIMIT_S
    detail = f"create/stat/unlink {median * 1e3:.2f} ms (median of {METADATA_ROUNDS})"
    return Step("metadata", ok, detail + ("" if ok else f" > {METADATA_LIMIT_S:g} s"))


def _chunks(budget_s: float) -> Iterator[int]:
    """CHUNK sizes up to PROBE_BYTES, stopping early once `budget_s` has passed."""
    t0, done = time.perf_counter(), 0
    while done < PROBE_BYTES and (done == 0 or time.perf_counter() - t0 < budget_s):
        yield CHUNK
        done += CHUNK


def _throughput(fd: int, report: MountReport, plan: Rates) -> Step:
    """The timed write and read; a slow one is tried once more and the better taken (a burst of
    another job's IO, or of this node's other processes, is not the mount's fault)."""
    full = _short_of_space(fd)
    if full is not None:
        return full
    step = _write_read(fd, report, plan)
    if step.ok or step.broken:
        return step
    first = (report.write_mb_per_s, report.read_mb_per_s)
    again = _write_read(fd, report, plan)
    if again.ok or again.broken:
        return again
    report.write_mb_per_s = max(first[0], report.write_mb_per_s)
    report.read_mb_per_s = max(first[1], report.read_mb_per_s)
    return _judge_rates(report, plan)


# A full filesystem or quota is every node's (and the saves report it): the gate does not blame a node.
NOT_THE_NODE = " (a full disk or quota is not this node's fault; the saves report it)"


def _short_of_space(fd: int) -> Optional[Step]:
    """A passing, untimed step when the mount has too little room for the probe."""
    try:
        st = os.fstatvfs(fd)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= 2 * PROBE_BYTES:
        return None
    return Step("throughput", True, f"not timed: {free / MiB:.1f} MiB free{NOT_THE_NODE}")


def _write_read(fd: int, report: MountReport, plan: Rates) -> Step:
    """Write (then fsync) and read back up to PROBE_BYTES; the read after dropping the file's
    pages (posix_fadvise DONTNEED), else it would time memory."""
    block = os.urandom(CHUNK)  # incompressible: a compressing filesystem is timed honestly
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        t0, written = time.perf_counter(), 0
        for size in _chunks(THROUGHPUT_BUDGET_S):
            written += os.write(fd, block[:size])
        os.fsync(fd)
        write_s = time.perf_counter() - t0
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.lseek(fd, 0, os.SEEK_SET)
        t0, read = time.perf_counter(), 0
        while read < written and (chunk := os.read(fd, CHUNK)):
            read += len(chunk)
        read_s = time.perf_counter() - t0
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            return Step("throughput", True, f"not timed: {_why(err)}{NOT_THE_NODE}")
        return Step("throughput", False, f"write/read failed: {_why(err)}", broken=True)
    report.write_mb_per_s = written / MB / max(write_s, 1e-9)
    report.read_mb_per_s = read / MB / max(read_s, 1e-9)
    report.probe_bytes = written
    return _judge_rates(report, plan)


def _judge_rates(report: MountReport, plan: Rates) -> Step:
    w, r = report.write_mb_per_s, report.read_mb_per_s
    detail = f"{report.probe_bytes / MiB:.0f} MiB: write {w:,.0f} MB/s, read {r:,.0f} MB/s"
    slow = [
        f"{what} below 1/{SLOW_FACTOR:g} {SLOW_MARK} {want:,.0f} MB/s"
        for what, got, want in (("write", w, plan.write_mb_per_s), ("read", r, plan.read_mb_per_s))
        if want and got * SLOW_FACTOR < want
    ]
    if not plan.write_mb_per_s and not plan.read_mb_per_s:
        detail += " (no planned rate to compare)"
    return Step("throughput", not slow, detail + ("; " + "; ".join(slow) if slow else ""))


def probe(
    path: Path, label: str, plan: Rates = Rates(), read_only: bool = False, rates: bool = True
) -> MountReport:
    """Every step on `path` in order, stopping at the first failure; leaves no file behind.
    `rates=False` skips metadata and throughput (a second mount on a filesystem already timed)."""
    t0 = time.perf_counter()
    report = MountReport(label, str(path))
    report.steps.append(_present(path))
    fd: Optional[int] = None
    try:
        if report.failed is None:
            step, fd = _writable(path, read_only)
            report.steps.append(step)
        if fd is not None:
            report.steps.append(_fsync(fd))
        if fd is not None and rates and report.failed is None:
            report.steps.append(_metadata(path))
        if fd is not None and rates and report.failed is None:
            report.steps.append(_throughput(fd, report, plan))
    finally:
        if fd is not None:
            os.close(fd)
            _probe_name(path).unlink(missing_ok=True)
    report.seconds = time.perf_counter() - t0
    return report


def probe_mounts(
    mounts: Sequence[tuple[str, Path]], plan: Rates = Rates(), read_only: bool = False
) -> list[MountReport]:
    """Each (label, path) in turn; metadata and rates once per filesystem (st_dev)."""
    seen: set[int] = set()
    reports = []
    for label, path in mounts:
        try:
            dev: Optional[int] = path.stat().st_dev
        except OSError:
            dev = None
        reports.append(probe(path, label, plan, read_only, rates=dev not in seen))
        if dev is not None:
            seen.add(dev)
    return reports


def probe_read_only_mount(
    mounts: Sequence[tuple[str, Path]], plan: Rates = Rates()
) -> list[MountReport]:
    """The probe seeing the mounts read-only for real (drills: `bad_storage_node`): in a child
    process in its own mount namespace where each path is bind-mounted read-only (root and
    `unshare -m`); else in this process with EROFS simulated. Other processes see no change."""
    script = "".join(
        f'mount --bind "{p}" "{p}" && mount -o remount,ro,bind "{p}" && ' for _, p in mounts
    )
    args = [f"{label}={path}" for label, path in mounts]
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c"]
    argv += [script + 'exec "$0" -m slurmtrain.common.storage_probe "$@"', sys.executable]
    try:
        done = subprocess.run(argv + args, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        done = None
    if done is None or done.returncode != 0 or not done.stdout.strip():
        return probe_mounts(mounts, plan, read_only=True)
    return [_report_from_line(line) for line in done.stdout.splitlines() if line.strip()]


def _report_from_line(line: str) -> MountReport:
    import json

    data = json.loads(line)
    steps = [Step(**s) for s in data.pop("steps")]
    return MountReport(**data, steps=steps)


def main(argv: Sequence[str]) -> int:
    """`python -m slurmtrain.common.storage_probe LABEL=PATH ...`: one JSON line each."""
    import json

    mounts = [(a.split("=", 1)[0], Path(a.split("=", 1)[1])) for a in argv]
    for report in probe_mounts(mounts):
        print(json.dumps(asdict(report)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
