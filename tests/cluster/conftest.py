"""Real-Slurm tests: one local cluster (tools/slurm_cluster.py) per session, shared, left running.

`start` is idempotent, so a cluster someone already started is reused, not restarted. With CI set,
missing Slurm is installed and any failure to bring the cluster up fails the session: CI never
skips these tests silently. Elsewhere a machine without Slurm (or without root) skips them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tools" / "slurm_cluster.py"
NODES = 4
NEEDED = [
    "slurmctld",
    "slurmd",
    "slurmdbd",
    "sbatch",
    "srun",
    "scontrol",
    "sacct",
    "munged",
    "mariadbd",
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slurm: needs the real local Slurm cluster (tools/slurm_cluster.py start)"
    )


@dataclass(frozen=True)
class ClusterInfo:
    nodes: list[str]
    partitions: dict  # name -> PartitionInfo of the CPU nodes' partitions (debug, high)
    state_dir: Path
    harness: Path
    gpu_partitions: dict = field(default_factory=dict)  # `gpu`: the GRES-declaring nodes n5-n6
    big_partitions: dict = field(default_factory=dict)  # `big`: the scale drill's n7-n24

    def slurmd_pid(self, node: str) -> int:
        return int((self.state_dir / "run" / f"slurmd-{node}.pid").read_text().split()[0])

    def start(self) -> subprocess.CompletedProcess:
        """Run the harness `start` again (brings back any slurmd that died)."""
        return subprocess.run(
            [
                sys.executable,
                str(self.harness),
                "start",
                "--nodes",
                str(len(self.nodes)),
                "--state-dir",
                str(self.state_dir),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}


def _missing() -> list[str]:
    return [b for b in NEEDED if not shutil.which(b) and not Path("/usr/sbin", b).exists()]


def _fail_or_skip(ci: bool, msg: str) -> None:
    if ci:
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def slurm_cluster() -> ClusterInfo:
    ci = _in_ci()
    if _missing() and ci and os.geteuid() == 0:
        subprocess.run([sys.executable, str(HARNESS), "install"], check=False, timeout=1800)
    missing = _missing()
    if missing:
        msg = (
            f"Slurm is not installed (missing {', '.join(missing)}); "
            f"run `sudo python {HARNESS.relative_to(REPO)} install`"
        )
        _fail_or_skip(ci, msg)
    if os.geteuid() != 0:
        _fail_or_skip(ci, "the local Slurm cluster needs root (munge, /etc/slurm, /etc/hosts)")
    state_dir = Path(os.environ.get("SLURMTRAIN_CLUSTER_DIR", "/tmp/slurmtrain-cluster")).resolve()
    info = ClusterInfo([f"n{i}" for i in range(1, NODES + 1)], {}, state_dir, HARNESS)
    res = info.start()
    if res.returncode != 0:
        pytest.fail(f"tools/slurm_cluster.py start failed:\n{res.stdout}\n{res.stderr}")
    from slurmtrain.common.slurm_cmd import query_partitions

    every = query_partitions()
    cpu = {k: p for k, p in every.items() if set(p.node_names) <= set(info.nodes)}
    big = {k: p for k, p in every.items() if k == "big"}
    gpu = {k: p for k, p in every.items() if k not in cpu and k not in big}
    return ClusterInfo(info.nodes, cpu, state_dir, HARNESS, gpu, big)


@pytest.fixture(autouse=True)
def _slurm_marker_needs_cluster(request: pytest.FixtureRequest) -> None:
    """Every test marked `slurm` gets the cluster, whether or not it names the fixture."""
    if request.node.get_closest_marker("slurm"):
        request.getfixturevalue("slurm_cluster")


@pytest.fixture(autouse=True)
def _detection_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans ask the real controller, as on a login node (tests/conftest.py turns detection off
    for the session): without it cluster.time=auto is the 48 h cap, which every partition's
    MaxTime here refuses."""
    monkeypatch.setenv("SLURMTRAIN_AUTO", "")


@pytest.fixture(autouse=True)
def _no_successor_outlives_its_test(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A run's singleton successor (issue 38) waits in the queue while its run lives; one queued
    as a test ends would start in a later test (the same --basetemp path, the same run). Only
    this session's (its script under the basetemp): another session's or a bench's are theirs."""
    yield
    mine = str(tmp_path_factory.getbasetemp().resolve()) + "/"
    out = subprocess.run(
        ["squeue", "-h", "-t", "PENDING", "-o", "%i|%j|%r|%o"], capture_output=True, text=True
    ).stdout
    ids = [f[0] for f in (line.split("|") for line in out.splitlines())
           if len(f) == 4 and f[1].startswith("st-") and f[2] == "Dependency"
           and f[3].startswith(mine)]  # fmt: skip
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)
