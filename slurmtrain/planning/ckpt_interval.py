"""Checkpoint interval math: Young/Daly optimum, analytic goodput and a Monte Carlo check of both.

Model (Daly 2006): work is cut into segments of `interval` seconds of compute followed by a blocking
save of `save` seconds. Failures of the whole job arrive as a Poisson process of mean `mtbf` seconds
(any node failing stops the job) at every moment, also during saves and restarts. After a failure the
job pays `restart` seconds (requeue, start-up, load; itself interruptible) and recomputes the
segment. Used by planning/policy.py (the default interval on GPUs and its cost in the plan),
tools/goodput_sim.py (compare intervals) and, for the measured save time, by the plan's
signal-lead check (planning/preflight.py).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.events import CheckpointSaved, Row

# Llama 3 (Dubey et al. 2024, sec. 3.3.4): 419 unexpected interruptions in 54 days of pre-training
# on 16,384 H100s = 2,048 nodes of 8 GPUs (faults.node_mtbf_h's default: 24 h / this).
LLAMA3_FAILURES_PER_NODE_DAY = 419 / (54 * 2048)
DAY = 86400.0


def _positive(name: str, value: float, fix: str) -> float:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(f"{name}={value!r}: must be a positive number of seconds; {fix}")
    return float(value)


def job_mtbf_seconds(
    nodes: int, failures_per_node_day: float = LLAMA3_FAILURES_PER_NODE_DAY
) -> float:
    """Mean time between failures of a job on `nodes` nodes: any node failing stops the job."""
    if not isinstance(nodes, int) or nodes < 1:
        raise ConfigError(f"nodes={nodes!r}: must be a positive integer; set nodes=N")
    _positive(
        "failures_per_node_day", failures_per_node_day, "give the fleet's failure rate per node-day"
    )
    return DAY / (nodes * failures_per_node_day)


def young_daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Young/Daly first-order optimum tau = sqrt(2 * save * MTBF): seconds of compute between saves."""
    save = _positive(
        "checkpoint save_seconds",
        save_seconds,
        "measure a save first or give the save time in seconds",
    )
    mtbf = _positive(
        "checkpoint mtbf_seconds", mtbf_seconds, "set the cluster's job MTBF in seconds"
    )
    return math.sqrt(2.0 * save * mtbf)


def measured_save_seconds(
    ledger: Sequence[Row], last: int = 5, worst: bool = False, total: bool = False
) -> Optional[float]:
    """The run's save time from its last `last` saves (its `CheckpointSaved` rows; None before
    the first save): their median, or with `worst` the longest. `total`: until published (async
    saves included; falls back to `seconds`), else `seconds` (what blocked the loop)."""
    secs = [
        (e.total_seconds if total else None) or e.seconds or 0.0
        for e in ledger
        if isinstance(e, CheckpointSaved)
    ]
    secs = [s for s in secs if s > 0][-last:]
    if not secs:
        return None
    return max(secs) if worst else statistics.median(secs)


@dataclass(frozen=True)
class Outcome:
    """Where the wall time went for one checkpoint interval (seconds; failures as a count)."""

    interval: float
    wall: float
    useful: float  # compute that ended up in a checkpoint
    saving: float  # blocking saves that completed
    lost: float  # compute (and partial saves) thrown away by failures
    restarting: float  # restart cost, failed restarts included
    failures: float

    @property
    def goodput(self) -> float:
        return self.useful / self.wall if self.wall > 0 else 0.0


def expected_segment_seconds(interval: float, save: float, restart: float, mtbf: float) -> float:
    """Expected wall time to get one interval of compute plus its save committed (Daly's exact form)."""
    return mtbf * math.exp(restart / mtbf) * math.expm1((interval + save) / mtbf)


def analytic(interval: float, save: float, restart: float, mtbf: float, wall: float) -> Outcome:
    """Expected outcome over `wall` seconds, by renewal-reward over committed segments."""
    _positive("interval", interval, "use a positive checkpoint interval")
    seg = interval + save
    cycle = expected_segment_seconds(interval, save, restart, mtbf)
    cycles = wall / cycle
    failed_tries = math.expm1(seg / mtbf)  # expected failed attempts at one segment
    lost = mtbf * failed_tries - seg  # sum of E[time to failure | failure within the segment]
    restarting = failed_tries * mtbf * math.expm1(restart / mtbf)
    return Outcome(
        interval,
        wall,
        cycles * interval,
        cycles * save,
        cycles * lost,
        cycles * restarting,
        wall / mtbf,
    )


def optimal_interval(save: float, restart: float, mtbf: float) -> float:
    """The exact optimum of the analytic model, by golden-section search on log(interval)."""

    def f(x: float) -> float:
        return -interval_goodput(math.exp(x), save, restart, mtbf)

    lo, hi = math.log(1e-3 * mtbf + 1e-9), math.log(10 * mtbf)
    g = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if f(a) < f(b):
            hi = b
        else:
            lo = a
    return math.exp((lo + hi) / 2)


def interval_goodput(interval: float, save: float, restart: float, mtbf: float) -> float:
    """Long-run expected goodput (useful / wall) of one interval."""
    return interval / expected_segment_seconds(interval, save, restart, mtbf)


def failure_times(mtbf: float, wall: float, rng: random.Random) -> list[float]:
    """One trial's failure instants in [0, wall): exponential gaps of mean `mtbf`."""
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(1.0 / mtbf)
        if t >= wall:
            return out
        out.append(t)


def replay(
    interval: float, save: float, restart: float, wall: float, failures: Sequence[float]
) -> Outcome:
    """Play one trial's failures against one interval. Failures are independent of the job's state,
    so every interval can replay the same list (common random numbers sharpen the comparison)."""
    seg = interval + save
    t = useful = saving = lost = restarting = 0.0
    need_restart = False
    for f in [*failures, wall]:
        if need_restart:
            if t + restart > f:  # failed again while restarting
                restarting += f - t
                t = f
                continue
            restarting += restart
            t += restart
            need_restart = False
        n = math.floor((f - t) / seg)
        useful, saving, t = useful + n * interval, saving + n * save, t + n * seg
        if f < wall:
            lost += f - t
            t, need_restart = f, True
    return Outcome(interval, wall, useful, saving, lost, restarting, float(len(failures)))


def monte_carlo(
    intervals: Sequence[float],
    save: float,
    restart: float,
    mtbf: float,
    wall: float,
    trials: int = 200,
    seed: int = 0,
) -> list[tuple[Outcome, float]]:
    """Mean outcome and goodput standard deviation per interval over `trials` random failure lists."""
    rng = random.Random(seed)
    runs: list[list[Outcome]] = [[] for _ in intervals]
    for _ in range(trials):
        fails = failure_times(mtbf, wall, rng)
        for i, tau in enumerate(intervals):
            runs[i].append(replay(tau, save, restart, wall, fails))
    out = []
    for tau, rs in zip(intervals, runs):
        n = len(rs)
        mean = Outcome(
            tau,
            wall,
            *(
                sum(getattr(r, k) for r in rs) / n
                for k in ("useful", "saving", "lost", "restarting", "failures")
            ),
        )
        var = sum((r.goodput - mean.goodput) ** 2 for r in rs) / max(n - 1, 1)
        out.append((mean, math.sqrt(var)))
    return out
