"""Hang forensics: the collective timeout's rule, the flight recorder's dumps in
RUN_DIR/logs, and the line naming the rank every other rank waited on. Real gloo ranks on CPUs
(torch's flight recorder records gloo too): three processes, rank 2 never joins the fifth
collective; ranks 0-1 dump while blocked in it, as the watchdog does before it exits."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from slurmtrain.cli import nccl_dumps
from slurmtrain.compute import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = r"""
import os, sys, threading, time, types
import torch, torch.distributed as dist
from slurmtrain.compute import distributed

rank = int(os.environ["RANK"])
faults = types.SimpleNamespace(startup_timeout_s=1800, hang_timeout_s=600, collective_timeout_s=1800)
dist.init_process_group("gloo", rank=rank, world_size=3, timeout=distributed.collective_timeout(faults))
x = torch.ones(4)
for _ in range(3):
    dist.all_reduce(x)
distributed.follow_phase("startup:convert", 300)  # rank 0 converts, the others wait in its broadcast
dist.broadcast(x, 0)
distributed.follow_phase("step", 600)
if rank == 2:  # never joins the fifth collective
    distributed.dump_collectives()
    # stay connected until ranks 0-1 have dumped (a busy box may take seconds): leaving earlier
    # breaks their all-reduce before their watchdogs fire
    prefix = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
    deadline = time.time() + 100
    while time.time() < deadline and not all(os.path.exists(f"{prefix}{r}") for r in (0, 1)):
        time.sleep(0.2)
    time.sleep(1)
    os._exit(0)
def watchdog():  # fires while the main thread waits in the all-reduce
    time.sleep(3)
    distributed.dump_collectives()
    os._exit(0)
threading.Thread(target=watchdog, daemon=True).start()
dist.all_reduce(x)
os._exit(1)  # never reached: rank 2 does not come
"""


def test_timeout_is_the_longest_fixed_deadline_plus_a_margin():
    f = types.SimpleNamespace(startup_timeout_s=1800, hang_timeout_s=600, collective_timeout_s=60)
    assert distributed.collective_timeout_s(f) == 1800 + 180  # the watchdog fires 3 min first
    f.collective_timeout_s = 7200  # a larger one set by hand wins
    assert distributed.collective_timeout(f).total_seconds() == 7200
    f = types.SimpleNamespace(startup_timeout_s=60, hang_timeout_s=30, collective_timeout_s=1)
    assert distributed.collective_timeout_s(f) == 60 + distributed.MARGIN_S


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    logs = tmp_path_factory.mktemp("run") / "logs"
    prefix = f"{logs}/nccl_trace.4242.0.0.rank_"
    procs = []
    for rank in range(3):
        env = dict(
            os.environ,
            RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(29400 + os.getpid() % 500),
            TORCH_NCCL_TRACE_BUFFER_SIZE="100",
            TORCH_NCCL_DEBUG_INFO_TEMP_FILE=prefix,
            PYTHONPATH=ROOT,
        )
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env))
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [0, 0, 0]
    return logs


def test_dumps_land_in_the_runs_logs_and_name_the_rank_that_never_joined(dumped):
    assert sorted(p.name for p in dumped.iterdir()) == [
        f"nccl_trace.4242.0.0.rank_{r}" for r in range(3)
    ]
    lines = nccl_dumps.summary(dumped)
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("collectives (flight recorder, attempt 4242.0.0, 3 dumps):")
    assert "rank 2 never joined collective #5 gloo:all_reduce 4 on default_pg" in line
    assert "ranks 0-1 waited in" in line and "rank 2: #4 gloo:broadcast" in line


def test_the_collective_timeout_follows_the_phases(dumped):
    entries = nccl_dumps.read(dumped / "nccl_trace.4242.0.0.rank_0")["entries"]
    timeouts = [e["timeout_ms"] / 1000 for e in entries]
    base = 1800 + 180
    # three all-reduces, the broadcast of a conversion (lifted), the step's all-reduce
    assert timeouts == [base, base, base, distributed.LIFTED_S, base]


def test_a_stall_where_every_rank_waited_says_none_stayed_behind():
    entry = dict(
        process_group=("0", "default_pg"),
        collective_seq_id=9,
        profiling_name="nccl:all_reduce",
        input_sizes=[[1024]],
        state="started",
        retired=False,
        is_p2p=False,
    )
    dumps = {r: {"entries": [dict(entry)], "pg_config": {}} for r in (0, 1, 3)}
    (stall,) = nccl_dumps.analyse(dumps, world=4)
    assert stall.waited == [0, 1, 3] and stall.no_dump == [2] and not stall.behind
    assert "none stayed behind" in stall.line() and "no dump from rank 2" in stall.line()


def test_a_file_that_is_not_a_dump_is_refused_not_executed(tmp_path):
    import pickle

    bad = tmp_path / "nccl_trace.1.0.0.rank_0"
    bad.write_bytes(pickle.dumps(types.SimpleNamespace(entries=[])))
    assert nccl_dumps.summary(tmp_path) == [
        "collectives: nccl_trace.1.0.0.rank_0: unreadable (UnpicklingError)"
    ]
