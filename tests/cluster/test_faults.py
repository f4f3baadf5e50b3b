"""Fault tolerance on the real local cluster: each failure happens for real, the run still finishes.

Failures are injected through SLURMTRAIN_INJECT (slurmtrain/compute/faults/inject.py), which
sbatch passes to the job like any environment variable; `attempts=1` confines an injection to the first attempt.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from slurmtrain.common.events import (
    AttemptEnded,
    BadNode,
    CheckpointLoaded,
    CheckpointSaved,
    Failed,
    FailureClass,
    Finished,
    NodeLost,
    Requeued,
    Signal,
    Started,
    Stopped,
)
from tests.cluster.helpers import (
    events,
    jobs_named,
    set_time_limit,
    steps_by_attempt,
    submit_run,
    time_limit_soon,
    wait_event,
    wait_until,
)
from tests.conftest import read_jsonl, run_cli

pytestmark = pytest.mark.slurm
BASE = [
    "cluster=slurm",
    "train.log_interval=1",
    "train.max_steps=30",
    "checkpoint.interval_steps=5",
    "faults.health_check=true",
]


def submit(workdir, name, args, inject=""):
    return submit_run(BASE, workdir, name, args, inject)


def test_time_limit_saves_requeues_and_finishes_with_no_step_lost(slurm_cluster, workdir):
    # Slurm checks time limits about every 30 s. Once the run trains, its limit is cut to 1 min:
    # USR2@30 comes 30-60 s into the job, before 100 steps of >= 0.5 s (+ start-up) are done. The
    # requeued job (same id) keeps the cut limit; it is lengthened so that attempt runs to the end.
    run = submit(
        workdir,
        "timelimit",
        ["nodes=2", "cluster.time=3", "cluster.signal_lead_s=30", "train.max_steps=100"],
        inject="step_delay=0.5",
    )
    assert time_limit_soon(run) == 1
    [requeued] = wait_event(run, Requeued, timeout=300)
    set_time_limit(str(requeued.new_job_id), 3)
    wait_event(run, Finished, timeout=400)
    ev = events(run)
    [sig, *_] = [e for e in ev if isinstance(e, Signal)]
    assert sig.signal == "SIGUSR2"
    saved = [e.step for e in ev if isinstance(e, CheckpointSaved) and e.attempt == 1]
    assert sig.step == saved[-1]  # every rank saved the step the signal was agreed at
    assert any(isinstance(e, AttemptEnded) and e.cls == FailureClass.timed_out for e in ev)
    assert any(isinstance(e, Requeued) for e in ev)
    attempts = steps_by_attempt(run)
    assert len(attempts) >= 2
    flat = [s for a in sorted(attempts) for s in attempts[a]]
    assert flat == list(range(1, 101))  # 0 steps lost, none computed twice


def test_preemption_saves_within_grace_and_the_run_finishes(slurm_cluster, workdir):
    run = submit(workdir, "preempted", ["nodes=2", "train.max_steps=40"], inject="step_delay=0.5")
    wait_until(
        lambda: (run / "metrics.jsonl").exists() and len(read_jsonl(run / "metrics.jsonl")) > 5,
        300,
        "training to start",
    )
    hog = subprocess.run(
        ["sbatch", "--parsable", "-p", "high", "-N4", "--exclusive", "--wrap", "sleep 3"],
        capture_output=True,
        text=True,
        check=True,
    )
    wait_event(run, Finished, timeout=400)
    ev = events(run)
    [sig] = [e for e in ev if isinstance(e, Signal) and e.attempt == 1]
    assert sig.signal == "SIGTERM"
    [end] = [e for e in ev if isinstance(e, AttemptEnded) and e.attempt == 1]
    assert end.cls == FailureClass.preempted
    saved = [e for e in ev if isinstance(e, CheckpointSaved) and e.attempt == 1]
    assert saved[-1].step == sig.step and saved[-1].time - sig.received_at < 20
    assert hog.stdout.strip()


def test_node_failure_requeues_resumes_and_names_the_lost_node(slurm_cluster, workdir):
    # node_check_s: this cluster's SlurmdTimeout is 10 s (the default, 330, is for production's 300)
    run = submit(
        workdir,
        "nodefail",
        ["nodes=2", "train.max_steps=40", "faults.node_check_s=45"],
        inject="step_delay=0.5",
    )
    wait_until(
        lambda: (
            (run / "metrics.jsonl").exists()
            and max(r["step"] for r in read_jsonl(run / "metrics.jsonl")) >= 12
        ),
        300,
        "step 12",
    )
    [started] = [e for e in events(run) if isinstance(e, Started)]
    victim = started.hosts[1]  # rank 1's node: the batch shell survives on rank 0's
    os.kill(slurm_cluster.slurmd_pid(victim), signal.SIGKILL)
    pid = started.pids[1]
    os.kill(pid, signal.SIGKILL)
    try:
        wait_event(run, Finished, timeout=500, fail_on=())
    finally:
        slurm_cluster.start()  # bring the node back for the other tests
        subprocess.run(
            ["scontrol", "update", f"nodename={victim}", "state=resume"], capture_output=True
        )
    ev = events(run)
    assert any(isinstance(e, NodeLost) and e.node == victim for e in ev)
    [end] = [e for e in ev if isinstance(e, AttemptEnded) and e.attempt == 1]
    assert end.cls == FailureClass.node_failure
    lost = (
        max(steps_by_attempt(run)[1]) - [e for e in ev if isinstance(e, CheckpointLoaded)][-1].step
    )
    assert lost <= 5  # at most one checkpoint interval


def test_stalled_rank_trips_the_watchdog_then_the_run_finishes(slurm_cluster, workdir):
    run = submit(
        workdir,
        "hang",
        ["nodes=2", "faults.hang_timeout_s=15", "train.max_steps=20"],
        inject="stall_at_step=8,stall_rank=1,attempts=1",
    )
    wait_event(run, Finished, timeout=400, fail_on=())
    ev = events(run)
    [end] = [e for e in ev if isinstance(e, AttemptEnded) and e.attempt == 1]
    assert end.cls == FailureClass.hang
    stacks = sorted((run / "hangs").glob("attempt1.*.txt"))  # one file per node, a block a rank
    assert len(stacks) == 2, stacks
    text = "".join(p.read_text() for p in stacks)
    assert "==== rank 0 ====" in text and "==== rank 1 ====" in text and "Thread" in text
    hang = [e for e in ev if isinstance(e, Failed) and e.cls == FailureClass.hang]
    last_step = max(steps_by_attempt(run)[1])
    step_time = [r for r in read_jsonl(run / "metrics.jsonl") if r["step"] == last_step][0]["time"]
    assert min(e.time for e in hang) - step_time < 15 + 30


def test_a_node_whose_ranks_never_join_the_rendezvous_is_named_excluded_and_the_run_finishes(
    slurm_cluster, workdir
):
    # Rank 1 stops (SIGSTOP, watchdog and all) before the rendezvous. Rank 0 waits out the
    # start-up deadline; the supervisor blames the node none of whose ranks had joined by then
    # (rank 1 may still write a row: Slurm sends SIGCONT with the SIGTERM that ends the step).
    run = submit(
        workdir,
        "absent",
        ["nodes=2", "faults.startup_timeout_s=30", "train.max_steps=10"],
        inject="absent_rank=1",
    )
    wait_event(run, Finished, timeout=400, fail_on=())
    ev = events(run)
    rows = [e for e in ev if isinstance(e, Failed) and e.attempt is None]
    first = min(rows, key=lambda e: e.time)
    assert first.rank == 0 and first.phase == "startup:rendezvous" and first.arrived_at
    absent = sorted(set(first.step_nodes) - {first.host})
    assert len(absent) == 1
    [ended] = [e for e in ev if isinstance(e, AttemptEnded) and e.before_started]
    assert ended.cls == FailureClass.hang and list(ended.failed_nodes) == absent
    bad = [r for r in read_jsonl(run / "bad_nodes.jsonl") if "never joined" in r["reason"]]
    assert [r["node"] for r in bad] == absent
    [started] = [e for e in ev if isinstance(e, Started)]
    assert absent[0] not in started.hosts


def test_injected_bad_node_is_excluded_on_the_next_attempt(slurm_cluster, workdir):
    run = submit(
        workdir, "badnode", ["nodes=2", "train.max_steps=10"], inject="bad_rank=1,attempts=1"
    )
    wait_event(run, Finished, timeout=400, fail_on=())
    ev = events(run)
    [bad] = [e for e in ev if isinstance(e, BadNode)]
    bad_rows = read_jsonl(run / "bad_nodes.jsonl")
    assert bad_rows[0]["node"] == bad.node
    starts = [e for e in ev if isinstance(e, Started)]
    assert bad.node in starts[0].hosts and bad.node not in starts[-1].hosts
    assert not any(isinstance(e, CheckpointLoaded) and e.attempt == 1 for e in ev)


def test_crash_loop_stops_and_status_shows_the_class_and_error(slurm_cluster, workdir):
    run = submit(workdir, "crashloop", ["nodes=2", "train.max_steps=20"], inject="crash_at_step=7")
    wait_event(run, Stopped, timeout=400, fail_on=())
    status = run_cli(["status", "--json", str(run)], cwd=workdir, module="slurmtrain.cli")
    row = json.loads(status.stdout.splitlines()[0])
    assert row["state"].startswith("stopped") and row["class"].startswith(FailureClass.crash)
    assert "injected crash at step 7" in row["error"]
    ended = [e for e in events(run) if isinstance(e, AttemptEnded)]
    assert [e.cls for e in ended] == [FailureClass.crash] * 2
    time.sleep(3)
    assert sum(isinstance(e, Started) for e in events(run)) == 2  # not restarted again


def test_nodes_whose_gpus_are_invisible_are_excluded_and_the_run_stops_when_none_is_left(
    slurm_cluster, workdir
):
    """The gpu partition's 2 nodes advertise 8 GPUs their tasks cannot see (a driver gone, a GPU
    off the bus). A 2-node run: each failure names both nodes; the job needs both, so they get one
    retry (Slurm requeues the same job id); failing again, they stay excluded and the run stops
    `no_nodes` saying why, instead of requeueing until the node-failure budget (20) runs out."""
    run = submit(workdir, "nogpus", ["nodes=2", "cluster.partition=gpu", "gpus_per_node=8"])
    [stop] = wait_event(run, Stopped, timeout=300, fail_on=())
    ev = events(run)
    ended = [e for e in ev if isinstance(e, AttemptEnded)]
    assert [e.cls for e in ended] == [FailureClass.node_failure] * 2
    assert [sorted(e.nodes) for e in ended] == [["n5", "n6"]] * 2
    assert [e.restart for e in ended] == [0, 1] and ended[0].job_id == ended[1].job_id
    failed = [e for e in ev if isinstance(e, Failed)]
    assert failed and all("sees no CUDA device" in e.error for e in failed)
    assert stop.cls == FailureClass.no_nodes and "n5, n6 failed again after a retry" in stop.error
    assert {r["node"] for r in read_jsonl(run / "bad_nodes.jsonl")} == {"n5", "n6"}
    assert not any(isinstance(e, Started) for e in ev)  # nothing trained
    status = run_cli(["status", "--json", str(run)], cwd=workdir, module="slurmtrain.cli")
    row = json.loads(status.stdout.splitlines()[0])
    assert row["state"] == "stopped: no_nodes" and "sees no CUDA device" in row["error"]
    time.sleep(3)
    assert not jobs_named("nogpus")  # its queued successor cancelled with the stop
