"""Slurm calls per failure decision: bounded and batched, counted against the real cluster.

`sinfo` and `scontrol` on PATH are wrappers that log their argv, then exec the real client: the
answers are Slurm's own. The failure decided is the costliest kind: an unexplained exit (no rank
recorded a real error) of a step whose nodes are all alive, so the supervisor polls Slurm until
its wait for a node to go down runs out.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from slurmtrain.batch import supervise
from slurmtrain.common import slurm_cmd
from slurmtrain.common.events import Failed, FailureClass

pytestmark = pytest.mark.slurm
WAIT_S = 30  # production waits SlurmdTimeout + 30 s (330 s by default); the bound is the same shape


@pytest.fixture
def logged(tmp_path: Path, monkeypatch) -> Path:
    """sinfo/scontrol wrappers that append `name argv...` to a log, then run the real one."""
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sinfo", "scontrol"):
        real = shutil.which(name)
        assert real, f"{name} is not on PATH"
        exe = bin_dir / name
        exe.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexec "{real}" "$@"\n')
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_an_unexplained_failure_costs_a_bounded_number_of_batched_slurm_calls(
    slurm_cluster, logged
):
    nodes = slurm_cluster.nodes  # all alive: the poll runs to its end, the worst case
    rows = [Failed(rank=1, cls=FailureClass.crash, error="", extra={"peer": True})]
    verdict = supervise.classify(1, [], rows, nodes, WAIT_S)
    assert verdict.nodes == []  # nobody is down
    made = calls(logged)
    assert made and all(c.startswith("sinfo ") for c in made)
    # one call names every node of the step (a hostlist), never one call per node
    assert all("-n n[1-4]" in c for c in made), made
    assert len(made) <= 6, f"{len(made)} calls: {made}"
    assert len(made) == len(slurm_cmd.poll_delays(WAIT_S)) + 1


def test_probing_the_slurmds_is_one_scontrol_call_for_all_nodes(slurm_cluster, logged):
    gpu = [n for p in slurm_cluster.gpu_partitions.values() for n in p.node_names]
    every = slurm_cluster.nodes + sorted(set(gpu))
    assert slurm_cmd.unreachable_nodes(every) == []
    assert [c.split()[:3] for c in calls(logged)] == [["scontrol", "show", "node"]]


def test_the_slurmd_probes_run_side_by_side(slurm_cluster, monkeypatch):
    """Every node's probe is in flight at once (up to the pool width), not one after another:
    each connect here waits until all have started, as dead hosts' connects would wait out their
    timeout. One at a time, the first would wait alone until its timeout and fail."""
    import socket
    import threading

    nodes = slurm_cluster.nodes
    arrived = threading.Barrier(len(nodes))

    def connect(address, timeout=None):
        try:
            arrived.wait(timeout)
        except threading.BrokenBarrierError:  # waited alone: a timed-out connect
            raise OSError("timed out") from None
        return socket.socket()

    monkeypatch.setattr(socket, "create_connection", connect)
    assert slurm_cmd.unreachable_nodes(nodes, timeout_s=3) == []
