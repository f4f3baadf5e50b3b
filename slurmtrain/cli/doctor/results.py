"""Shared pieces of the doctor: the result type, the options, and a subprocess runner that never raises.

Every check returns `CheckResult`s instead of raising, so one broken tool (no slurm.conf, a hung
controller, a torch that cannot import) shows up as a row with advice rather than a traceback.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Optional, Sequence

Status = Literal["ok", "warn", "fail"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail")
CONTAINERS = ("none", "apptainer", "pyxis")


@dataclass(frozen=True)
class CheckResult:
    """One row of the report: what was checked, how it went, what was seen, and what to do."""

    name: str
    status: Status
    value: str
    advice: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CheckResult":
        status = data.get("status")
        if status not in STATUSES:
            status = "fail"
        return cls(str(data.get("name", "?")), status, str(data.get("value", "")), str(data.get("advice", "")))


def default_runs_root() -> Path:
    """Same default as conf/config.yaml: $SLURMTRAIN_RUNS_ROOT, else ./runs."""
    return Path(os.environ.get("SLURMTRAIN_RUNS_ROOT") or "runs")


@dataclass
class DoctorOptions:
    """What to check. `site_paths` replaces sys.path for the installed-wheel scan (tests plant wheels there)."""

    runs_root: Path = field(default_factory=default_runs_root)
    partition: Optional[str] = None
    container: str = "none"
    planned_checkpoint_gb: Optional[float] = None
    site_paths: Optional[list[str]] = None
    command_timeout: float = 8.0
    probe_timeout: float = 90.0
    shared_marker: Optional[Path] = None  # set on compute nodes by --srun: a file the login node created


@dataclass(frozen=True)
class Cmd:
    """Outcome of one external command; rc 127 = not found, 124 = timed out."""

    argv: tuple[str, ...]
    rc: int
    out: str
    err: str
    timeout: float = 0.0

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def reason(self) -> str:
        """The last meaningful stderr (or stdout) line: Slurm puts the real cause last ('fatal: ...')."""
        last = ""
        for text in (self.err, self.out):
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            if lines:
                last = lines[-1]
                break
        if self.rc == 124:
            return f"{last} (no answer within {self.timeout:g} s)" if last else f"no answer within {self.timeout:g} s"
        return last or f"exit code {self.rc}"


def run_cmd(argv: Sequence[str], timeout: float, env: Optional[dict[str, str]] = None) -> Cmd:
    """Run an argument list (never a shell) with a timeout; never raises."""
    full_env = {**os.environ, "LC_ALL": "C", **(env or {})}
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=full_env,
                              stdin=subprocess.DEVNULL, errors="replace")
    except FileNotFoundError:
        return Cmd(tuple(argv), 127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired as exc:  # keep what it said so far: often the real cause
        return Cmd(tuple(argv), 124, _text(exc.stdout), _text(exc.stderr), timeout)
    except OSError as err:
        return Cmd(tuple(argv), 126, "", f"{argv[0]}: {err}")
    return Cmd(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


def _text(data: "bytes | str | None") -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def on_compute_node() -> bool:
    """Inside a Slurm job step (what --srun starts), as opposed to a login node."""
    return bool(os.environ.get("SLURM_STEP_ID") or os.environ.get("SLURM_JOB_ID"))
