"""Shared test helpers: run `python -m slurmtrain` as a user would, in a scratch directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, TypeVar

import pytest

if TYPE_CHECKING:
    from slurmtrain.common.events import Row, Rows

R = TypeVar("R", bound="Row")

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
# cluster=auto / gpus_per_node=auto mean "this machine, CPU ranks" in tests, even on a machine that
# runs the Slurm test cluster or has GPUs (slurmtrain/login/placement.py); tests that want
# detection pass SLURMTRAIN_AUTO="" in their env.
os.environ.setdefault("SLURMTRAIN_AUTO", "off")


def slurmtrain_env(extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SLURMTRAIN_INJECT", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def run_gloo_ranks(script: str, world: int, *args: str, timeout: float = 240) -> None:
    """`python -c script *args RANK` as `world` gloo ranks on loopback; each must exit 0."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = slurmtrain_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *args, str(r)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err


def run_cli(
    args: list[str],
    cwd: Path,
    env: Optional[dict[str, str]] = None,
    module: str = "slurmtrain",
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", module, *args],
        cwd=cwd,
        env=slurmtrain_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def dry_run_file(stdout: str, what: str = "config") -> Path:
    """A file a dry run wrote and named (it prints the plan, then these paths): `config` (the
    resolved config, secrets as references) or `script` (the batch script, cluster=slurm)."""
    label = r"full config \(or --cfg job\)" if what == "config" else "batch script"
    [path] = re.findall(label + r":\s+(\S+)", stdout)
    return Path(path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ledger_events(run: Path) -> Rows:
    """A run's ledger as every reader sees it: all writers' files merged (RunDir.events): row
    objects (common/events.py), read by `isinstance` and attributes."""
    from slurmtrain.common.rundir import RunDir

    return RunDir(run).events()


def ledger_of(run: Path, kind: type[R]) -> list[R]:
    """A run's ledger rows of one kind (a row class of common/events.py), in time order."""
    return [e for e in ledger_events(run) if isinstance(e, kind)]


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/*/config.yaml"))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def no_slurm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Plan as on a laptop: no controller is asked (SLURMTRAIN_AUTO=off), nothing cached."""
    from slurmtrain.login import placement

    monkeypatch.setenv("SLURMTRAIN_AUTO", "off")
    placement._probe_cache.clear()
    yield
    placement._probe_cache.clear()


# Tensor and sequence parallelism are checked against DeepSpeed without either, on one rank with
# accumulation 4: the same global batch 8 (micro 2) as TP 2 x DP 2 on 4 ranks and SP 2 on 2.
PARALLEL_ARGS = [
    "train.max_steps=20",
    "train.log_interval=1",
    "train.global_batch_size=8",
    "train.micro_batch_size=2",
    "checkpoint.interval_steps=10",
    "data.valid_fraction=0.01",  # validation windows: a TP or SP group evaluates the same ones
    "train.eval_interval=10",
]


@pytest.fixture(scope="session")
def parallel_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run TP and SP must equal (one process start for both tests)."""
    work = tmp_path_factory.mktemp("parallel_reference")
    done = run_cli(PARALLEL_ARGS + ["name=reference", "cluster.cpu_tasks_per_node=1"], cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(work / "runs")
    return run


@pytest.fixture(autouse=True)
def _umask_kept() -> Iterator[None]:
    """The login path narrows the process umask to the run's mode (ownership.tighten_umask): as a
    user's command, once; in one pytest process, it would leak into every later test."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)
