"""The local cluster behaves like a real one: nodes, srun, sacct, preemption, node failure, requeue.

These are the Slurm behaviours the training job relies on; each test drives real Slurm daemons.
The cluster is shared by the session, so every test cleans up its jobs and restores its nodes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from typing import Callable

import pytest

from slurmtrain.common import slurm_cmd, slurm_text

pytestmark = pytest.mark.slurm
UP = {"idle", "mix", "alloc", "comp"}


def sh(*args: str, timeout: float = 120) -> str:
    res = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{' '.join(args)}: {res.stderr or res.stdout}"
    return res.stdout


def sbatch(*args: str) -> str:
    return sh("sbatch", "--parsable", "-o", "/dev/null", *args).strip().split(";")[0]


def wait_until(what: str, ok: Callable[[], object], timeout: float = 120) -> object:
    """Poll for a Slurm state change; the timeout only bounds a hang, it is not what we test."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = ok()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"gave up after {timeout:.0f}s waiting for {what}")


def node_state(node: str) -> str:
    return sh("sinfo", "-h", "-N", "-n", node, "-o", "%t").split()[0]


def requeued(job_id: str) -> dict:
    """The job's record once Slurm has requeued it and says why it waits, else {}.

    Right after the requeue the reason reads "None" until the scheduler's next pass assesses it.
    """
    info = slurm_cmd.job_info(job_id)
    assessed = info["Reason"] != "None"
    return info if info["Restarts"] != "0" and info["JobState"] == "PENDING" and assessed else {}


def first_attempt_state(job_id: str) -> str:
    """How accounting ended the job's first run ("" until slurmdbd has recorded it)."""
    states = sh("sacct", "-n", "-D", "-X", "-P", "-j", job_id, "-o", "State").split()
    return states[0] if len(states) > 1 else ""


def running_on(job_id: str) -> str:
    info = slurm_cmd.job_info(job_id)
    return info["NodeList"] if info["JobState"] == "RUNNING" else ""


@pytest.fixture
def jobs():
    """Job ids a test submits; all cancelled afterwards so the shared cluster stays clean."""
    ids: list[str] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)


SLURM_FACTS = pytest.mark.skipif(
    os.environ.get("SLURMTRAIN_TEST_SLURM_FACTS") != "1",
    reason="a Slurm fact DESIGN.md records, checked once per harness change (slow: SlurmdTimeout, "
    "requeue delays); set SLURMTRAIN_TEST_SLURM_FACTS=1",
)


def test_all_four_nodes_answer(slurm_cluster):
    states = {n: node_state(n) for n in slurm_cluster.nodes}
    assert slurm_cluster.nodes == ["n1", "n2", "n3", "n4"]
    assert all(s in UP for s in states.values()), states


def test_partition_big_holds_eighteen_answering_nodes_apart_from_debug(slurm_cluster):
    big = slurm_cluster.big_partitions["big"]
    assert len(big.node_names) == 18 and not set(big.node_names) & set(slurm_cluster.nodes)
    states = sh("sinfo", "-h", "-N", "-p", "big", "-o", "%N %t").split("\n")
    assert {ln.split()[0] for ln in states if ln.strip()} == set(big.node_names)
    assert all(ln.split()[1] in UP for ln in states if ln.strip()), states


def test_node_names_resolve_to_loopback(slurm_cluster):
    assert {socket.gethostbyname(n) for n in slurm_cluster.nodes} == {"127.0.0.1"}


def test_start_again_is_a_no_op(slurm_cluster):
    before = slurm_cluster.slurmd_pid("n1")
    res = slurm_cluster.start()
    assert res.returncode == 0, res.stderr
    assert slurm_cluster.slurmd_pid("n1") == before
    assert all(node_state(n) in UP for n in slurm_cluster.nodes)


def test_srun_two_nodes_runs_on_two_distinct_nodes(slurm_cluster):
    out = sh("srun", "-N2", "--ntasks-per-node=1", "-t", "2", "bash", "-c", "echo $SLURMD_NODENAME")
    names = out.split()
    assert len(names) == 2 and len(set(names)) == 2 and set(names) <= set(slurm_cluster.nodes)


def test_rendezvous_agrees_across_real_srun_tasks(slurm_cluster):
    code = (
        "import json, os; from slurmtrain.common.slurm_text import rendezvous_from_env as r; "
        "print(json.dumps(r(os.environ)))"
    )
    out = sh("srun", "-N2", "-n4", "--ntasks-per-node=2", "-t", "2", sys.executable, "-c", code)
    envs = [json.loads(line) for line in out.splitlines()]
    assert sorted(int(e["RANK"]) for e in envs) == [0, 1, 2, 3]
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"], e["WORLD_SIZE"]) for e in envs}) == 1
    assert envs[0]["WORLD_SIZE"] == "4" and envs[0]["MASTER_ADDR"] in slurm_cluster.nodes
    assert sorted(e["LOCAL_RANK"] for e in envs) == ["0", "0", "1", "1"]
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}


def test_sacct_records_a_finished_job(slurm_cluster, jobs):
    job = sbatch("--wait", "-t", "1", "--wrap", "true")
    jobs.append(job)

    def record():
        out = sh("sacct", "-n", "-X", "-P", "-j", job, "-o", "JobID,State,ExitCode").strip()
        return out if "COMPLETED" in out else ""

    assert wait_until("sacct to record the job", record) == f"{job}|COMPLETED|0:0"
    assert slurm_cmd.job_state(job) == "COMPLETED"


def test_query_partitions_reads_the_real_partitions(slurm_cluster):
    parts = slurm_cluster.partitions
    assert list(parts) == ["debug", "high"]
    debug, high = parts["debug"], parts["high"]
    assert debug.default and not high.default
    assert debug.node_names == high.node_names == tuple(slurm_cluster.nodes)
    assert debug.preempt_mode == "REQUEUE" and debug.grace_time_s == 20
    assert high.priority_tier > debug.priority_tier
    errors = slurm_text.validate_request("debug", 8, "03:00:00", 1, parts)
    assert [e.split(":")[0] for e in errors] == [
        "cluster.nodes",
        "cluster.time",
        "cluster.gpus_per_node",
    ]
    assert slurm_text.validate_request("high", 4, "03:00:00", 0, parts) == []


def task_script(tmp_path, name: str, on_term: str) -> str:
    """A batch script whose srun task logs SIGTERM to <name>.marks, then runs `on_term`."""
    marks, script = tmp_path / f"{name}.marks", tmp_path / f"{name}.sh"
    script.write_text(
        "#!/bin/bash\n"
        f'srun bash -c \'trap "echo TERM >> {marks}; {on_term}" TERM; '
        "sleep 600 & wait'\n"
    )
    return str(script)


def preempt(nodes: str, jobs: list) -> str:
    high = sbatch("-p", "high", "-w", nodes, "--exclusive", "-t", "2", "--wrap", "sleep 2")
    jobs.append(high)
    return high


def nodes_settled() -> bool:
    """No node still completing an earlier test's job (preemption cannot free such a node)."""
    states = sh("sinfo", "-h", "-N", "-o", "%t").split()
    return bool(states) and not any(s.startswith("comp") for s in states)


def test_high_partition_preempts_a_debug_job_by_requeue(slurm_cluster, jobs, tmp_path):
    """Its tasks get SIGTERM at once; still running when GraceTime ends, the job is requeued."""
    wait_until("nodes to finish completing earlier jobs", nodes_settled)
    low = sbatch(
        "-p",
        "debug",
        "-N1",
        "--exclusive",
        "--requeue",
        "-t",
        "10",
        task_script(tmp_path, "low", 'trap \\"exit 0\\" TERM; sleep 600'),
    )
    jobs.append(low)
    node = wait_until("the debug job to run", lambda: running_on(low))
    high = preempt(node, jobs)
    wait_until("the TERM to reach the task", (tmp_path / "low.marks").exists, 60)
    assert slurm_cmd.is_preempted(low) and slurm_cmd.job_info(low)["JobState"] == "RUNNING"
    info = wait_until("the debug job to be requeued", lambda: requeued(low))
    assert info["Restarts"] == "1" and info["Reason"] == "BeginTime"
    assert (tmp_path / "low.marks").read_text().split() == ["TERM"]
    assert wait_until("sacct", lambda: first_attempt_state(low)) == "PREEMPTED"
    assert wait_until(
        "the high job to run",
        lambda: running_on(high) == node or slurm_cmd.job_state(high) == "COMPLETED",
    )


def test_preempted_job_that_exits_in_its_grace_time_must_requeue_itself(
    slurm_cluster, jobs, tmp_path
):
    """Slurm 22.05 requeues only jobs still running at GraceTime's end; the rest must ask."""
    wait_until("nodes to finish completing earlier jobs", nodes_settled)
    quits = sbatch(
        "-p",
        "debug",
        "-N1",
        "--exclusive",
        "--requeue",
        "-t",
        "10",
        task_script(tmp_path, "quits", "exit 0"),
    )
    asks = sbatch(
        "-p",
        "debug",
        "-N1",
        "--exclusive",
        "--requeue",
        "-t",
        "10",
        task_script(tmp_path, "asks", "scontrol requeue $SLURM_JOB_ID; exit 0"),
    )
    jobs += [quits, asks]
    nodes = [wait_until("the debug jobs to run", lambda j=j: running_on(j)) for j in (quits, asks)]
    preempt(",".join(nodes), jobs)
    assert wait_until("the quitter to end", lambda: slurm_cmd.job_state(quits) == "COMPLETED")
    assert slurm_cmd.is_preempted(quits) and slurm_cmd.job_info(quits)["Restarts"] == "0"
    info = wait_until("the asker to be requeued", lambda: requeued(asks))
    assert info["Restarts"] == "1" and info["Reason"] == "BeginTime"


@SLURM_FACTS
def test_requeued_job_waits_until_start_now(slurm_cluster, jobs, tmp_path):
    starts = tmp_path / "starts"
    job = sbatch(
        "--requeue",
        "-t",
        "5",
        "--wrap",
        f"echo attempt ${{SLURM_RESTART_COUNT:-0}} >> {starts}; sleep 600",
    )
    jobs.append(job)
    wait_until("the first attempt to start", lambda: starts.exists())
    assert not slurm_cmd.is_preempted(job)  # a SIGTERM now would be a scancel, not a preemption
    slurm_cmd.requeue(job)
    info = wait_until("the requeue", lambda: requeued(job))
    eligible = datetime.fromisoformat(info["EligibleTime"])
    assert info["Reason"] == "BeginTime" and eligible > datetime.now()
    slurm_cmd.start_now(job)
    assert datetime.fromisoformat(slurm_cmd.job_info(job)["EligibleTime"]) < eligible
    wait_until("the second attempt to start", lambda: "attempt 1" in starts.read_text())
    assert starts.read_text().splitlines() == ["attempt 0", "attempt 1"]
    assert slurm_cmd.job_state(job) == "RUNNING"


def test_exclude_nodes_keeps_a_pending_job_off_them(slurm_cluster, jobs):
    job = sbatch("--hold", "-t", "2", "--wrap", "sleep 30")
    jobs.append(job)
    slurm_cmd.exclude_nodes(job, ["n1", "n2"])
    assert slurm_cmd.job_info(job)["ExcNodeList"] == "n[1-2]"
    sh("scontrol", "release", job)
    assert wait_until("the job to run", lambda: running_on(job)) in {"n3", "n4"}


@SLURM_FACTS
def test_killed_slurmd_downs_its_node_and_requeues_its_job(slurm_cluster, jobs):
    node = "n3"
    job = sbatch("-w", node, "--requeue", "-t", "10", "--wrap", "sleep 600")
    jobs.append(job)
    wait_until("the job to run", lambda: running_on(job))
    os.kill(slurm_cluster.slurmd_pid(node), signal.SIGKILL)
    try:
        wait_until(f"{node} to go DOWN", lambda: node_state(node).startswith("down"), 180)
        info = wait_until("the job to be requeued", lambda: requeued(job), 60)
        assert info["Restarts"] == "1"
        assert wait_until("sacct", lambda: first_attempt_state(job)) == "NODE_FAIL"
    finally:  # bring the node back for the rest of the session
        res = slurm_cluster.start()
        assert res.returncode == 0, res.stdout + res.stderr
        if node_state(node) not in UP:
            sh("scontrol", "update", f"nodename={node}", "state=resume")
        wait_until(f"{node} to come back", lambda: node_state(node) in UP, 60)


@pytest.mark.skipif(
    os.environ.get("SLURMTRAIN_TEST_8_NODES") != "1",
    reason="restarts the shared cluster; set SLURMTRAIN_TEST_8_NODES=1",
)
def test_start_with_eight_nodes_then_back_to_four(slurm_cluster):
    cmd = [
        sys.executable,
        str(slurm_cluster.harness),
        "start",
        "--state-dir",
        str(slurm_cluster.state_dir),
        "--nodes",
    ]
    try:
        sh(*cmd, "8", timeout=300)
        nodes = [f"n{i}" for i in range(1, 9)]
        assert all(node_state(n) in UP for n in nodes)
        out = sh("srun", "-N8", "-t", "2", "bash", "-c", "echo $SLURMD_NODENAME")
        assert sorted(out.split()) == sorted(nodes)
    finally:
        sh(*cmd, "4", timeout=300)
