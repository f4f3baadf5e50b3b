"""Waiting on real Slurm jobs through their run directories (no mocks: the ledger is the truth)."""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Callable, TypeVar

from slurmtrain.batch.successor import job_name
from slurmtrain.common import slurm_cmd
from slurmtrain.common.events import Failed, Row, Rows, Started
from slurmtrain.common.rundir import RunDir

R = TypeVar("R", bound=Row)


def events(run: Path) -> Rows:
    return RunDir(run).events()


def rows_of(run: Path, kind: type[R]) -> list[R]:
    """The run's ledger rows of one kind (a row class of common/events.py)."""
    return [e for e in events(run) if isinstance(e, kind)]


def wait_until(check: Callable[[], bool], timeout: float, what: str, poll: float = 1.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_event(
    run: Path,
    kind: type[R],
    timeout: float = 300,
    count: int = 1,
    fail_on: tuple[type[Row], ...] = (Failed,),
) -> list[R]:
    """Wait for `count` rows of a kind; an unexpected `fail_on` row fails at once."""

    def check() -> bool:
        rows = events(run)
        bad = [e for e in rows if isinstance(e, fail_on)]
        assert not bad, f"unexpected {bad[-1].event}: {getattr(bad[-1], 'error', None)}"
        return sum(isinstance(e, kind) for e in rows) >= count

    wait_until(check, timeout, f"{count} x {kind.kind!r} in the ledger of {run}")
    return rows_of(run, kind)


def wait_job_gone(job_id: str, timeout: float = 120) -> None:
    def gone() -> bool:
        out = subprocess.run(
            ["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
        return out == ""

    wait_until(gone, timeout, f"job {job_id} to leave the queue")


def time_limit_soon(run: Path, lead_s: int = 30, margin_s: int = 5) -> int:
    """Once the run trains, shorten its job's time limit as an admin would (`scontrol update
    TimeLimit=`) to the fewest whole minutes that still leave more than the signal lead. Slurm
    then sends the lead's signal at its next time-limit check (every ~30 s) instead of minutes into
    the job: the same path as `--time`, without the wait. Returns the new limit in minutes."""
    wait_until(
        lambda: (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").stat().st_size > 0,
        300,
        "training to start",
    )
    [job_id] = [str(e.job_id) for e in rows_of(run, Started)][-1:]
    start_time = slurm_cmd.job_info(job_id)["StartTime"]
    start = datetime.strptime(start_time, "%Y-%m-%dT%H:%M:%S").timestamp()
    minutes = max(1, math.ceil((time.time() - start + lead_s + margin_s) / 60))
    set_time_limit(job_id, minutes)
    return minutes


def set_time_limit(job_id: str, minutes: int) -> None:
    """`scontrol update JobId= TimeLimit=` (root may lengthen it too: a requeued job keeps the
    limit time_limit_soon cut, and its next attempt should run to the end)."""
    slurm_cmd.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}"])


def only_run(root: Path, name: str) -> Path:
    runs = sorted(p.parent for p in (root / name).glob("*/config.yaml"))
    assert len(runs) == 1, runs
    return runs[0]


def jobs_named(name: str) -> list[str]:
    """`id state` of this user's jobs of runs named `name`: `st-NAME`, or a single run's own
    `st-NAME-FINGERPRINT8` (batch/successor.job_name)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %T %j"], capture_output=True, text=True).stdout
    own = re.compile(rf"st-{re.escape(name)}(-[0-9a-f]{{8}})?")
    return [" ".join(f[:2]) for f in (line.split() for line in out.splitlines())
            if len(f) == 3 and own.fullmatch(f[2])]  # fmt: skip


def cancel_all_of(name: str) -> None:
    ids = [line.split()[0] for line in jobs_named(name)]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)


def submit_run(
    base: list[str], workdir: Path, name: str, args: list[str], inject: str = ""
) -> Path:
    """`python -m slurmtrain` with `base + args` (and a SLURMTRAIN_INJECT fault); the run dir."""
    from tests.conftest import run_cli

    env = {"SLURMTRAIN_INJECT": inject} if inject else None
    opt_in = ["faults.allow_inject=true"] if inject else []
    done = run_cli(base + [f"name={name}"] + args + opt_in, cwd=workdir, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return only_run(workdir / "runs", name)


def steps_by_attempt(run: Path) -> dict[int, list[int]]:
    """metrics.jsonl's steps, per attempt."""
    from tests.conftest import read_jsonl

    out: dict[int, list[int]] = {}
    for row in read_jsonl(run / "metrics.jsonl"):
        out.setdefault(row["attempt"], []).append(row["step"])
    return out


@contextlib.contextmanager
def node_killed(slurm_cluster, started: Started, index: int):
    """Kill the node of rank `index` (its slurmd and its rank); bring it back on the way out."""
    victim = started.hosts[index]
    os.kill(slurm_cluster.slurmd_pid(victim), signal.SIGKILL)
    os.kill(started.pids[index], signal.SIGKILL)
    try:
        yield victim
    finally:
        slurm_cluster.start()
        subprocess.run(
            ["scontrol", "update", f"nodename={victim}", "state=resume"], capture_output=True
        )


def queued_of(name: str, run: Path) -> list[str]:
    """`id state` of this user's jobs under the run's own name (squeue; one that failed, the
    controller busy, counts as not empty)."""
    done = subprocess.run(
        ["squeue", "-h", "-n", job_name(name, run), "-o", "%i %T"], capture_output=True, text=True
    )
    return [line for line in done.stdout.splitlines() if line.strip()] or (
        [] if done.returncode == 0 else ["squeue failed"]
    )


def job_pids(job_id: str) -> list[int]:
    """Every process of the job on its node: its slurmstepds and what they run (batch shell,
    srun, ranks), found in /proc (the nodes share one host; `scontrol listpids` asks one slurmd)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"slurmstepd: [{job_id}." in cmd or f"SLURM_JOB_ID={job_id}".encode() in env:
            found.append(int(proc.name))
    return found
