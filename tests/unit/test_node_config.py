"""compute/node_config.py: the ranks of one node read the run's config.yaml from the shared tier
once (the node's first rank copies it node-locally); the copy is per attempt and removed after
the rendezvous; without a job id every rank reads the shared file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from slurmtrain.common.rundir import RunDir
from slurmtrain.compute import node_config
from slurmtrain.compute.distributed import Placement


def _where(rank: int, job: str | None = "77") -> Placement:
    return Placement(rank, rank, 2, "127.0.0.1", 29500, job, "n1")


def _typed(path: str) -> SimpleNamespace:
    return SimpleNamespace(name=Path(path).read_text(), model=SimpleNamespace(config=None))


def test_a_node_reads_the_shared_config_once(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(node_config.ROOT_ENV, str(tmp_path / "shm"))
    # the file's text stands for the typed config (the schema's load is not the subject)
    monkeypatch.setattr(node_config, "load_run_config", _typed)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.config.write_text("once")
    assert node_config.load(run, _where(0)).name == "once"  # the node's first rank: copies it
    run.config.unlink()  # the second rank of the node never touches the shared file
    assert node_config.load(run, _where(1)).name == "once"
    node_config.forget(run, _where(1))  # local rank 1: leaves it
    node_config.forget(run, _where(0))
    assert list((tmp_path / "shm").glob("*/*")) == []
    with pytest.raises(OSError):  # no copy, no job id: the shared file, as every rank did
        node_config.load(run, _where(1, job=None))
