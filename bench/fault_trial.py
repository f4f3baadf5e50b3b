"""A fault trial on the local Slurm cluster: one run to break, and what its ledger says.

Used by bench/fault_recipes.py (the faults of bench/fault_matrix.py) and
bench/node_failure_recovery.py. A `Trial` submits a short opt_tiny run through `python -m
slurmtrain`, finds its run directory and reads its ledger and metrics; the helpers reach Slurm and
the cluster harness (tools/slurm_cluster.py) the way tests/cluster does. The recipes live apart:
this file is how a trial runs, that one what each fault does to it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Callable, Optional, Sequence, TypeVar, Union

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from metric_fields import integer  # noqa: E402

from slurmtrain.common import events, rundir  # noqa: E402
from slurmtrain.common.events import FailureClass, Row, Rows  # noqa: E402
from slurmtrain.common.jsonl import read_jsonl  # noqa: E402
from slurmtrain.common.rundir import RunDir  # noqa: E402

R = TypeVar("R", bound=Row)

# How a trial's run ends (Trial.wait_end, a recipe's `ended`): the run's end state, or how a
# recipe ended it; `stuck`: nobody will restart it.
FINISHED, STOPPED = rundir.FINISHED, rundir.STOPPED
CANCELLED, REFUSED, STUCK = events.Cancelled.kind, "refused", "stuck"


class Expect(Enum):
    """What a fault must leave in the ledger besides a failure class or a row of one kind."""

    nothing_failed = "none"  # one clean chain, no failure recorded
    first_attempt_failed = "attempt 1 ended, not cancelled"  # its class may be any


@dataclass(frozen=True)
class Check:
    """A recipe's own verdict on the ended trial: None when clean, else what was wrong (a trial
    with a Check recovers only when it passes)."""

    what: str
    problem: Callable[["Trial"], Optional[str]]


# What a recipe expects recorded: a failure class (of an attempt_ended, stopped or failed row), a
# row kind, an Expect, or a Check.
Want = Union[FailureClass, type[Row], Expect, Check]

HARNESS = ROOT / "tools" / "slurm_cluster.py"
STATE_DIR = Path(os.environ.get("SLURMTRAIN_CLUSTER_DIR", "/tmp/slurmtrain-cluster"))
SHARD = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
BASE = [
    "cluster=slurm",
    "cluster.cpu_tasks_per_node=1",
    "nodes=2",
    "train.log_interval=1",
    "train.max_steps=30",
    "checkpoint.interval_steps=10",
    "faults.health_check=true",
]


@dataclass
class Trial:
    """One run of one fault: where it trains and what the fault did to it."""

    workdir: Path
    name: str
    run: Optional[Path] = None
    corrupted: set[str] = field(default_factory=set)
    cleanup: list[Callable[[], object]] = field(default_factory=list)  # what they return is unused
    notes: list[str] = field(default_factory=list)
    ended: Optional[str] = None  # set by a recipe whose end is no ledger event (cancelled, refused)
    index: int = 1  # the trial's number within its fault (a recipe may vary what it injects)
    culprit_rank: Optional[int] = None  # the rank whose node a recipe put at fault, if it chose

    def submit(
        self, args: list[str], inject: str = "", extra: Optional[dict[str, str]] = None
    ) -> Path:
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        env.update(extra or {})  # reaches the ranks: sbatch exports the submitting environment
        env.pop("SLURMTRAIN_INJECT", None)
        opt_in = []
        if inject:  # a drill opts in on the command (faults.allow_inject), or is refused
            env["SLURMTRAIN_INJECT"] = inject
            opt_in = ["faults.allow_inject=true"]
        done = subprocess.run(
            [sys.executable, "-m", "slurmtrain", *BASE, f"name={self.name}", *args, *opt_in],
            cwd=self.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"submit failed: {done.stdout}{done.stderr}".strip()[-800:])
        [self.run] = sorted(
            p.parent for p in (self.workdir / "runs" / self.name).glob("*/config.yaml")
        )
        return self.run

    @property
    def path(self) -> Path:
        """The run directory, once `submit` has found it."""
        if self.run is None:
            raise RuntimeError(f"{self.name}: not submitted yet")
        return self.run

    def events(self) -> Rows:
        return RunDir(self.run).events() if self.run else []

    def of(self, kind: type[R]) -> list[R]:
        """The ledger's rows of one kind."""
        return [e for e in self.events() if isinstance(e, kind)]

    def metrics(self) -> list[dict[str, object]]:
        return read_jsonl(self.run / "metrics.jsonl") if self.run else []

    def wait(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if check():
                return
            time.sleep(1)
        raise TimeoutError(f"{what} not within {timeout:.0f} s")

    def wait_step(self, step: int, timeout: float = 300) -> None:
        self.wait(
            lambda: max((integer(r, "step") or 0 for r in self.metrics()), default=0) >= step,
            timeout,
            f"step {step}",
        )

    def wait_event(self, kind: type[R], timeout: float = 400) -> R:
        self.wait(lambda: bool(self.of(kind)), timeout, f"event {kind.kind}")
        return self.of(kind)[-1]

    def wait_end(self, timeout: float = 600, idle_s: float = 90) -> str:
        """rundir.FINISHED | STOPPED once the run's last job has left the queue; `stuck` when no
        job of the run has been queued for `idle_s` and the ledger has no end (nobody will restart
        it)."""
        if self.ended:
            return self.ended
        deadline, idle_since = time.time() + timeout, None
        while time.time() < deadline:
            if any(isinstance(e, (events.Finished, events.Stopped)) for e in self.events()):
                break
            jobs = {str(e.job_id) for e in self.of(events.Submitted)}
            jobs |= {str(e.new_job_id) for e in self.of(events.Requeued)}
            if any(squeue_state(j) for j in jobs):
                idle_since = None
            elif idle_since is None:
                idle_since = time.time()
            elif time.time() - idle_since > idle_s:
                return STUCK
            time.sleep(2)
        else:
            raise TimeoutError(f"no finished or stopped within {timeout:.0f} s")
        for job in {str(e.job_id) for e in self.of(events.Submitted)}:
            self.wait(left_queue(job), 120, f"job {job} to leave the queue")
        return FINISHED if self.of(events.Finished) else STOPPED

    def paused_at_20(self, args: Sequence[str] = ()) -> None:
        self.submit([*args, "train.pause_at_step=20"])
        self.wait_event(events.Paused)
        job = str(self.of(events.Submitted)[-1].job_id)
        self.wait(left_queue(job), 120, f"job {job} to end")

    def flip(self, step: int) -> None:
        shard = self.path / "checkpoints" / f"step_{step}" / SHARD
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
        self.corrupted.add(shard.parent.name)


def rank1(started: events.Started) -> tuple[str, Optional[int]]:
    """Rank 1's node and pid in a `started` row (its node is not the batch shell's, rank 0's)."""
    return started.hosts[1], started.pids[1] if len(started.pids) > 1 else None


def kill_node(t: Trial, victim: str, pids: Sequence[Optional[int]]) -> None:
    """The node dies: its slurmd SIGKILLed and, the nodes sharing one host, the job's processes
    on it by hand; the trial's cleanup brings the slurmd back and the node into service."""
    pid = int((STATE_DIR / "run" / f"slurmd-{victim}.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    for p in pids:
        try:
            if p is not None:
                os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def back() -> None:
        harness("start", "--nodes", "4")
        sh("scontrol", "update", f"nodename={victim}", "state=resume")

    t.cleanup.append(back)


def left_queue(job: str) -> Callable[[], bool]:
    return lambda: not squeue_state(job)


def squeue_state(job: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()


def sh(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True).stdout.strip()


def harness(*args: str) -> None:
    subprocess.run(
        [sys.executable, str(HARNESS), *args, "--state-dir", str(STATE_DIR)],
        capture_output=True,
        text=True,
        timeout=300,
    )
