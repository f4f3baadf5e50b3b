"""Slurm calls per failure decision are bounded whatever the wait; slurmd probes run side by side.

Counting against the real cluster is tests/cluster/test_slurm_calls.py; here the schedule and the
probe pool, which need no Slurm (the probes are plain TCP connects to local sockets).
"""

from __future__ import annotations

import socket
import threading

from slurmtrain.common import slurm_cmd


def test_polls_per_decision_are_bounded_at_the_production_wait():
    assert len(slurm_cmd.poll_delays(330)) + 1 == 15  # SlurmdTimeout 300 + 30: was 166 at 2 s
    assert len(slurm_cmd.poll_delays(45)) + 1 == 6
    assert sum(slurm_cmd.poll_delays(330)) == 330 and max(slurm_cmd.poll_delays(3600)) == 30
    assert slurm_cmd.poll_delays(0) == []


def test_probes_tell_live_from_dead_slurmds():
    live = socket.socket()
    live.bind(("127.0.0.1", 0))
    live.listen(64)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: a connect is refused
    try:
        targets = [(f"n{i}", "127.0.0.1", live.getsockname()[1]) for i in range(1, 40)]
        targets.append(("n40", "127.0.0.1", closed.getsockname()[1]))
        assert slurm_cmd.probe_slurmds(targets, timeout_s=3, deadline_s=30) == ["n40"]
    finally:
        live.close()
        closed.close()


def test_probes_run_side_by_side_at_most_the_pool_width_and_stop_at_the_deadline(monkeypatch):
    lock, now, most = threading.Lock(), [0], [0]
    release = threading.Event()

    def slow(addr, port, timeout_s):  # a dead host: the connect hangs until its timeout
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        release.wait(timeout_s)
        with lock:
            now[0] -= 1
        return False

    monkeypatch.setattr(slurm_cmd, "_accepts", slow)
    targets = [(f"n{i}", "10.0.0.1", 6818) for i in range(200)]
    dead = slurm_cmd.probe_slurmds(targets, timeout_s=5, deadline_s=0.5)
    assert most[0] == slurm_cmd.PROBE_WORKERS  # side by side, never more at once
    # none had failed by the deadline (each would at its 5 s timeout): the wait ended there and
    # none is named
    assert dead == []
    release.set()
