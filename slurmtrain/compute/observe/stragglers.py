"""Stragglers by default: per-rank section clocks that never sync the device, and rank 0's scoring.

Each rank times its step's sections (data wait, forward, backward, optimizer): on CUDA with events
read a window later (an event is only read once `query()` says the device passed it), on CPU with
the wall clock. Every log interval perf.py's one all_gather carries the per-micro-step means, and
rank 0 scores each rank's data+forward time against the median rank's and against its own history:
forward has no collective under ZeRO 0-2, so a rank's peers never wait inside it (backward and the
optimizer hold the gradient reduce and the parameter all-gather: a slow rank's delay shows there on
its fast peers). A node's score is its slowest rank's. Above `faults.straggler_threshold` the
slowest node gets one `straggler` row per window; above it for `faults.straggler_windows` windows
in a row it is chronic, and with `faults.exclude_stragglers` goes to the bad-node ledger; when the
allocation holds an idle spare the attempt stops at once (saved) and restarts on it, else the next
attempt leaves the node out.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch

from slurmtrain.common import events
from slurmtrain.common.jsonl import append_jsonl

if TYPE_CHECKING:
    from slurmtrain.common.events import Row
    from slurmtrain.common.schema import RootConfig

DATA, FORWARD, BACKWARD, OPTIMIZER, SCORED = range(5)
SECTIONS = ("data", "forward", "backward", "optimizer")
# take()'s last value, SCORED: on CPU the median micro step's data+forward *CPU* time of the
# process (ranks sharing cores with other jobs are descheduled, which wall time would blame on
# them; a slow CPU still spends more CPU time), on CUDA the device's data+forward time (the mean).
HISTORY = 8  # windows of a rank's own past its history score compares with
# The bad-node ledger's reason for a chronic straggler (exclusions honour it, not "straggler").
CHRONIC = "chronic_straggler"


def rank_scores(times: Sequence[float]) -> list[float]:
    """Each rank's time over the median of the *other* ranks' (1.0 where that is not positive, or
    alone): with 2 ranks a plain median is their mean and would halve a slow rank's excess.
    O(n log n): each rank's others' median is read off the one sorted list."""
    order = sorted(range(len(times)), key=times.__getitem__)
    ranked = [times[r] for r in order]
    where = {r: p for p, r in enumerate(order)}
    n = len(times) - 1  # the others' count

    def other(p: int, j: int) -> float:  # the j-th smallest time once position p is left out
        return ranked[j] if j < p else ranked[j + 1]

    scores = []
    for rank, t in enumerate(times):
        p = where[rank]
        median = (
            0.0
            if n < 1
            else other(p, n // 2)
            if n % 2
            else (other(p, n // 2 - 1) + other(p, n // 2)) / 2
        )
        scores.append(t / median if median > 0 else 1.0)
    return scores


def node_scores(scores: Sequence[float], hosts: Sequence[str]) -> dict[str, tuple[float, int]]:
    """node -> (its slowest rank's score, that rank)."""
    out: dict[str, tuple[float, int]] = {}
    for rank, (score, node) in enumerate(zip(scores, hosts)):
        if node not in out or score > out[node][0]:
            out[node] = (score, rank)
    return out


def history_score(time_now: float, past: Sequence[float]) -> float:
    """This window's time over the median of the rank's own past windows (1.0 with no past)."""
    median = statistics.median(past) if past else 0.0
    return time_now / median if median > 0 else 1.0


@dataclass(frozen=True)
class Verdict:
    """The slowest node of a window: its score, its slowest rank, that rank's history score,
    how many windows in a row the node was above the threshold, whether it is chronic (this
    attempt, so far) and whether it became so in this window."""

    node: str
    rank: int
    score: float
    history: float
    windows: int
    chronic: bool
    new: bool = False


class Streaks:
    """Consecutive windows each node spent above the threshold; chronic once at `windows`."""

    def __init__(self, threshold: float, windows: int) -> None:
        self.threshold, self.windows = threshold, max(1, windows)
        self.count: dict[str, int] = {}
        self.chronic: set[str] = set()

    def update(self, nodes: dict[str, tuple[float, int]]) -> dict[str, int]:
        """Count this window; node -> its streak (0 when it was not above the threshold)."""
        self.count = {
            n: self.count.get(n, 0) + 1 for n, (s, _) in nodes.items() if s > self.threshold
        }
        return self.count

    def newly_chronic(self) -> list[str]:
        found = [n for n, c in self.count.items() if c >= self.windows and n not in self.chronic]
        self.chronic.update(found)
        return found


def judge(
    times: Sequence[float],
    hosts: Sequence[str],
    past: Sequence[Sequence[float]],
    streaks: Streaks,
) -> Optional[Verdict]:
    """The slowest node of a window when it is above the threshold, else None (streaks counted)."""
    nodes = node_scores(rank_scores(times), hosts)
    counts = streaks.update(nodes)
    chronic = streaks.newly_chronic()
    if not nodes:
        return None
    node = max(nodes, key=lambda n: nodes[n][0])
    score, rank = nodes[node]
    if score <= streaks.threshold:
        return None
    hist = history_score(times[rank], past[rank] if rank < len(past) else ())
    sticky = node in streaks.chronic
    return Verdict(node, rank, score, hist, counts.get(node, 0), sticky, node in chronic)


class Sections:
    """One rank's section clock: `start()` before a micro step, `lap(SECTION)` after each section.
    `slow` > 1 (injected slow_node/slow_rank): the forward and backward sections take that many
    times as long: on CPU spinning (CPU time, as a slower CPU spends), on CUDA sleeping after a
    device sync (a gap the events see; a drill only)."""

    def __init__(self, device: torch.device, slow: float = 1.0) -> None:
        self.cuda = device.type == "cuda"
        self.slow = slow
        self.host = [0.0] * len(SECTIONS)
        self.micro = 0  # micro steps timed on the host since the last take
        self.scored: list[float] = []  # CPU: each micro step's data+forward time
        self.device_micro = 0
        self.pending: deque[tuple[int, torch.cuda.Event, torch.cuda.Event]] = deque()
        self.t = self.c = 0.0  # wall and process CPU clocks at the last lap
        self.mark: Optional[torch.cuda.Event] = None

    def start(self) -> None:
        self.t = time.perf_counter()
        if not self.cuda:
            self.c = time.process_time()
        self.micro += 1

    def lap(self, section: int) -> None:
        if self.slow > 1 and section in (FORWARD, BACKWARD):
            self._slow_down()
        now = time.perf_counter()
        if not self.cuda or section == DATA:  # the host waits for its data: host time
            self.host[section] += now - self.t
        if not self.cuda:
            cpu = time.process_time()
            if section in (DATA, FORWARD):
                self._score(section, cpu - self.c)
            self.c = cpu
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            if section != DATA and self.mark is not None:
                self.pending.append((section, self.mark, event))
            self.mark = event
        self.t = now

    def _slow_down(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            time.sleep((self.slow - 1) * (time.perf_counter() - self.t))
        else:
            spin((self.slow - 1) * (time.process_time() - self.c))

    def _score(self, section: int, seconds: float) -> None:
        if section == DATA:
            self.scored.append(seconds)
        elif self.scored:
            self.scored[-1] += seconds

    def take(self) -> list[float]:
        """Seconds per micro step of each section since the last take, then the scored time
        (SCORED); on CUDA the events the device has passed (the rest wait for the next window:
        nothing here syncs)."""
        host, micro, scored = self.host, max(self.micro, 1), self.scored
        self.host, self.micro, self.scored = [0.0] * len(SECTIONS), 0, []
        out = [v / micro for v in host]
        if not self.cuda:
            return [*out, statistics.median(scored) if scored else 0.0]
        done = [0.0] * len(SECTIONS)
        counted = 0
        while self.pending and self.pending[0][2].query():
            section, begin, end = self.pending.popleft()
            done[section] += begin.elapsed_time(end) / 1e3
            counted += section == OPTIMIZER
        for s in (FORWARD, BACKWARD, OPTIMIZER):
            out[s] = done[s] / max(counted, 1)
        return [*out, out[DATA] + out[FORWARD]]


def spin(cpu_seconds: float) -> None:
    """Busy-wait until this process spent `cpu_seconds` more CPU time (an injected slow CPU)."""
    end = time.process_time() + cpu_seconds
    while time.process_time() < end:
        pass


def exclude_stragglers(cfg: RootConfig) -> bool:
    """faults.exclude_stragglers, or (unset) whether the run has spares."""
    f = cfg.faults
    return bool(f.exclude_stragglers) if f.exclude_stragglers is not None else f.spare_nodes > 0


class Watch:
    """Rank 0's scoring over the windows of an attempt; the first window (warm-up) is not judged."""

    def __init__(
        self,
        cfg: RootConfig,
        hosts: Sequence[str],
        record: Callable[[Row], object],
        bad_nodes: Path,
    ) -> None:
        f = cfg.faults
        self.hosts, self.record, self.bad_nodes = list(hosts), record, bad_nodes
        self.streaks = Streaks(float(f.straggler_threshold), int(f.straggler_windows))
        self.exclude = exclude_stragglers(cfg)
        self.past: list[deque[float]] = [deque(maxlen=HISTORY) for _ in self.hosts]
        self.windows = 0
        # Set by the Trainer: stop the attempt now (saved) so the supervisor puts a spare in place.
        self.replace: Optional[Callable[[], None]] = None

    def window(self, step: int, sections: Sequence[Sequence[float]]) -> dict[str, float]:
        """Score one window (rows: each rank's seconds per section); the tracker's fields."""
        self.windows += 1
        times = [r[SCORED] for r in sections]
        if self.windows == 1 or len(times) != len(self.hosts):
            return {}
        verdict = judge(times, self.hosts, self.past, self.streaks)
        for rank, t in enumerate(times):
            self.past[rank].append(t)
        scores = rank_scores(times)
        slowest = max(range(len(scores)), key=scores.__getitem__) if scores else 0
        fields = {"straggler_score": max(scores, default=1.0), "straggler_rank": float(slowest)}
        if verdict is not None:
            self._report(step, verdict)
        return fields

    def _report(self, step: int, v: Verdict) -> None:
        excluded = v.chronic and self.exclude
        self.record(
            events.Straggler(
                rank=v.rank,
                node=v.node,
                factor=round(v.score, 3),
                step=step,
                history=round(v.history, 3),
                windows=v.windows,
                chronic=v.chronic or None,
                excluded=excluded or None,
            )
        )
        # Every window's straggler is offered (advisory: exclusions skip the reason); a chronic
        # one that is to be excluded gets a row exclusions honour.
        reasons = (
            (events.Straggler.kind, CHRONIC) if excluded and v.new else (events.Straggler.kind,)
        )
        for reason in reasons:
            append_jsonl(
                self.bad_nodes,
                {"node": v.node, "reason": reason, "factor": round(v.score, 3), "step": step}
                | {"rank": v.rank, "time": time.time()},
            )
        if not v.new:
            return
        replace = self.replace if excluded and spare_idle(self.hosts) else None
        if replace is not None:
            replace()
        then = "; stopping now (saved) for a spare to take its place" if replace else ""
        print(
            f"slurmtrain: chronic straggler: node {v.node} (rank {v.rank}) at {v.score:.2f}x "
            f"the median rank for {v.windows} windows"
            + (f"; excluded from the next attempt{then}" if excluded else ""),
            file=sys.stderr,
            flush=True,
        )


def spare_idle(hosts: Sequence[str]) -> bool:
    """Whether the Slurm allocation holds a node this attempt does not train on (a spare, with
    faults.spare_nodes): the supervisor then restarts inside the allocation, no queue wait."""
    allocated = os.environ.get("SLURM_JOB_NUM_NODES", "")
    return allocated.isdigit() and int(allocated) > len(set(hosts))
