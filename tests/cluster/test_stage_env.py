"""cluster.stage_env on the real local cluster: a 2-node job whose ranks import torch from each
node's own unpacked copy of the venv (every fake node shares this machine's disk, so each node's
copy is keyed by its name: login/stage_env.py)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from slurmtrain.common.events import Finished, Started, Startup
from tests.cluster.helpers import events, only_run, wait_event, wait_job_gone
from tests.conftest import run_cli

pytestmark = pytest.mark.slurm
# The pack (~400 MB, ~15 s) is cached by the venv's hash: kept between test runs on this machine.
PACKS = Path("/tmp/slurmtrain-test-env-packs")


def test_two_node_job_runs_its_ranks_from_each_nodes_staged_copy(slurm_cluster, workdir):
    stage_dir = workdir / "node-local"
    done = run_cli(
        [
            "cluster=slurm",
            "nodes=2",
            "name=staged",
            "train.max_steps=4",
            "train.log_interval=1",
            "cluster.stage_env=true",
            f"cluster.stage_env_dir={stage_dir}",
            f"cluster.stage_env_cache={PACKS}",
        ],
        cwd=workdir,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run(workdir / "runs", "staged")
    [finished] = wait_event(run, Finished, timeout=600)
    assert finished.step == 4
    [started] = [e for e in events(run) if isinstance(e, Started)]
    wait_job_gone(started.job_id)
    nodes = sorted(set(started.hosts))
    assert len(nodes) == 2
    # Each node unpacked its own copy, named by the node, in the user's own 0700 directory.
    mine = stage_dir / f"slurmtrain-envs-{os.getuid()}"
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
    copies = sorted(p.name for p in mine.iterdir() if (p / "bin" / "python").exists())
    assert [c.rsplit("-", 1)[1] for c in copies] == nodes, copies
    # Every rank says where its torch came from: its own node's copy.
    logs = sorted((run / "logs").glob(f"{started.job_id}_[0-9]*.out"))
    assert len(logs) == len(started.hosts), logs  # one log per rank
    for log in logs:
        said = re.search(r"rank (\d+) on (\S+): staged (\S+), torch (\S+)", log.read_text())
        assert said, log.read_text()[-2000:]
        rank, node, staged, torch_file = said.groups()
        assert staged == f"{mine}/{copies[0].split('-')[0]}-{node}"
        assert torch_file.startswith(staged + "/lib/") and "site-packages/torch" in torch_file
    # Rank 0's start-up row records it too; `report` shows it.
    [row] = [e for e in events(run) if isinstance(e, Startup)]
    assert row.staged_env and row.torch_from.startswith(row.staged_env)
    assert set(row.phases) >= {"launch", "imports", "rendezvous", "build", "first_step"}
