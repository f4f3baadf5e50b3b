"""Shared pieces of the doctor: the result type and the options (commands run through common.commands).

Every check returns `CheckResult`s instead of raising, so one broken tool (no slurm.conf, a hung
controller, a torch that cannot import) shows up as a row with advice rather than a traceback.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Mapping, Optional, TypedDict

from slurmtrain.common.commands import Cmd, run_cmd  # noqa: F401  (the doctor's checks use both)

Status = Literal["ok", "warn", "fail"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail")
CONTAINERS = ("none", "apptainer", "pyxis", "oci")


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
    def from_dict(cls, data: Mapping[str, object]) -> "CheckResult":
        status: Status = next((s for s in STATUSES if s == data.get("status")), "fail")
        return cls(
            str(data.get("name", "?")),
            status,
            str(data.get("value", "")),
            str(data.get("advice", "")),
        )


class NodeDoc(TypedDict):
    node: str
    host: str
    checks: list[dict[str, str]]  # CheckResult.to_dict() each


class DoctorDoc(TypedDict, total=False):
    """The doctor's --json line: "doctor" first marks its start in srun's interleaved output."""

    doctor: int
    node: str
    host: str
    ok: bool
    checks: list[dict[str, str]]
    nodes: list[NodeDoc]


def default_runs_root() -> Path:
    """Same default as conf/config.yaml: $SLURMTRAIN_RUNS_ROOT, else ./runs."""
    return Path(os.environ.get("SLURMTRAIN_RUNS_ROOT") or "runs")


@dataclass
class DoctorOptions:
    """What to check. `site_paths` replaces sys.path for the installed-wheel scan (tests plant wheels there)."""

    runs_root: Path = field(default_factory=default_runs_root)
    partition: Optional[str] = None
    container: str = "none"
    image: Optional[str] = None  # cluster.image: checked before anything is queued
    planned_checkpoint_gb: Optional[float] = None
    site_paths: Optional[list[str]] = None
    command_timeout: float = 8.0
    probe_timeout: float = 90.0
    shared_marker: Optional[Path] = (
        None  # set on compute nodes by --srun: a file the login node created
    )
    setup: list[str] = field(default_factory=list)  # cluster.setup's lines, run here to check them
    checkpoint_dir: Optional[Path] = None  # checkpoint.dir: probed like the runs root
    # The plan's per-node rates (faults.io_*_mb_per_s; the schema's defaults): a probe 10x
    # slower fails, as in the health gate (0: not compared).
    io_write_mb_per_s: float = 1000.0
    io_read_mb_per_s: float = 2000.0


def on_compute_node() -> bool:
    """Inside a Slurm job step (what --srun starts), as opposed to a login node."""
    return bool(os.environ.get("SLURM_STEP_ID") or os.environ.get("SLURM_JOB_ID"))
