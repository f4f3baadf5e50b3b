"""The event-by-event model behind tools/goodput_sim.py: one job of N nodes with K hot spares, a
shared checkpoint tier, an optional node-local tier with a buddy copy, and a queued successor.

Every node held, spares too, fails at the fleet's rate. A failed spare is gone. A failed training
node costs the work since the newest copy that survives plus detection, then, with a spare left and
the batch node alive, a restart inside the allocation: from the node-local tier (own copy, the
replaced node's shards from its buddy) when one survives, else from the shared tier. A node's
shards have two local copies (its own, its buddy's); both are gone when the node and its buddy
fail before the next local save re-creates them: after a restart from the local tier that is 2 of
the N nodes (the replaced node's buddy, and the node whose buddy it was), after a restart from the
shared tier any node (no local copy yet). Without a spare, or when the batch node dies, the
allocation ends: its node-local copies go with it, the job waits in the queue (the successor's wait,
or a human's without one) and restarts from the shared tier with K fresh spares.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, fields
from typing import Sequence


@dataclass(frozen=True)
class SpareModel:
    """One job with K hot spares (seconds and node counts; `rate` in failures per node-second)."""

    nodes: int
    spares: int
    wall: float
    rate: float
    interval: float  # compute between shared saves
    save: float  # seconds a shared save blocks training
    detect: float  # failure -> noticed
    restart_in: float  # in-allocation restart from the shared tier: srun on a spare, start-up, load
    restart_out: float  # after a trip through the queue: start-up, load from the shared tier
    repair: float = 0.0  # mean seconds until a lost node is back as a spare; 0: next allocation
    local_interval: float = 0.0  # compute between node-local saves; 0: no local tier
    local_save: float = 0.0  # seconds a local save (write + buddy copy) blocks training
    restart_local: float = 0.0  # in-allocation restart from the local tier (buddy -> spare)
    successor: bool = True  # a queued successor takes over when the batch node dies
    human_wait: float = 0.0  # without one: seconds until a human resubmits
    successor_scale: float = 1.0  # the successor's queue wait, in queue waits

    @property
    def per_shared(self) -> int:
        """Local segments per shared save (1 without a local tier)."""
        if self.local_interval <= 0:
            return 1
        return max(1, round(self.interval / self.local_interval))

    @property
    def local_compute(self) -> float:
        """Compute between local saves: the shared interval cut evenly (all of it without a tier)."""
        return self.interval / self.per_shared

    @property
    def local_seg(self) -> float:
        """One local segment: compute, then the local save (the shared one comes on top)."""
        return self.local_compute + (self.local_save if self.local_interval > 0 else 0.0)


@dataclass
class Tally:
    """Where one trial's wall time went; the parts sum to `wall`."""

    wall: float
    nodes: int
    useful: float = 0.0
    saving: float = 0.0  # shared saves
    local_saving: float = 0.0
    lost: float = 0.0  # compute (and partial saves) since the newest surviving copy, thrown away
    detecting: float = 0.0
    restarting: float = 0.0
    queued: float = 0.0
    spare_node_s: float = 0.0  # node-seconds of spares held (their cost)
    failures: int = 0  # training nodes
    spare_failures: int = 0
    in_alloc: int = 0
    requeues: int = 0
    from_local: int = 0  # restarts from the node-local tier
    both_lost: int = 0  # restarts from the shared tier because a node's two local copies were gone
    batch_lost: int = 0

    @property
    def goodput(self) -> float:
        return self.useful / self.wall

    @property
    def paid(self) -> float:
        """Node-seconds paid: the training nodes over the wall, spares too."""
        return self.nodes * self.wall + self.spare_node_s

    @property
    def paid_goodput(self) -> float:
        """Useful node-seconds per node-second paid."""
        return self.useful * self.nodes / self.paid


@dataclass(frozen=True)
class QueueWait:
    """Seconds a job waits in the queue: lognormal (median, p90) or drawn from measured waits."""

    median: float = 1800.0
    p90: float = 14400.0
    empirical: tuple[float, ...] = ()

    def draw(self, rng: random.Random) -> float:
        if self.empirical:
            return rng.choice(self.empirical)
        sigma = math.log(self.p90 / self.median) / 1.2815515655446004  # z of the 90th percentile
        return rng.lognormvariate(math.log(self.median), sigma)


class Draws:
    """The random inputs of a trial (a test replaces them with a script)."""

    def __init__(self, rng: random.Random, waits: QueueWait) -> None:
        self.rng, self.waits = rng, waits

    def gap(self, rate: float) -> float:
        return self.rng.expovariate(rate) if rate > 0 else math.inf

    def is_spare(self, spares: int, nodes: int) -> bool:
        return self.rng.random() < spares / (nodes + spares)

    def queue_wait(self) -> float:
        return self.waits.draw(self.rng)

    def repair(self, mean: float) -> float:
        return self.rng.expovariate(1.0 / mean)

    def one_of(self, count: int, nodes: int) -> bool:
        """Whether the failed training node is one of `count` given nodes of `nodes`."""
        return self.rng.random() < count / nodes


class Job:
    """Progress since the last shared save, in wall seconds of segments (saves included)."""

    def __init__(self, m: SpareModel, out: Tally) -> None:
        self.m, self.out, self.p, self.supers = m, out, 0.0, 0
        self.super_len = m.per_shared * m.local_seg + m.save
        self.mark, self.copies = 0, 0  # local saves done at the last restart; 2, 1 or 0 copies

    def advance(self, span: float) -> None:
        m, out = self.m, self.out
        done = math.floor((self.p + span) / self.super_len)
        out.useful += done * m.interval
        out.saving += done * m.save
        out.local_saving += done * m.per_shared * (m.local_save if m.local_interval > 0 else 0)
        self.p, self.supers = self.p + span - done * self.super_len, self.supers + done

    def local_done(self) -> int:
        return self.supers * self.m.per_shared + min(
            self.m.per_shared, math.floor(self.p / self.m.local_seg)
        )

    def fail(self, ends: bool, draw: Draws) -> bool:
        """A training node failed: drop the work no surviving copy holds; True: from local."""
        m, out = self.m, self.out
        copies = 2 if self.local_done() > self.mark else self.copies
        both_gone = copies == 0 or (copies == 1 and draw.one_of(2, m.nodes))
        if m.local_interval <= 0 or ends or both_gone:
            out.both_lost += int(m.local_interval > 0 and not ends)
            out.lost, self.p = out.lost + self.p, 0.0
            self.mark, self.copies = self.local_done(), 0
            return False
        keep = min(m.per_shared, math.floor(self.p / m.local_seg)) * m.local_seg
        out.lost, self.p = out.lost + self.p - keep, keep
        self.mark, self.copies, out.from_local = self.local_done(), 1, out.from_local + 1
        return True


def _allocation(m: SpareModel, draw: Draws, out: Tally, t: float) -> tuple[float, bool]:
    """One allocation from its start at `t` until it ends; (when, whether the batch node died)."""
    back: list[float] = []  # when each node in repair is back as a spare, soonest first
    spares, pending, job = m.spares, m.restart_out, Job(m, out)
    while t < m.wall:
        fail = t + draw.gap((m.nodes + spares) * m.rate)
        end = min(fail, m.wall, back[0] if back else math.inf)
        out.spare_node_s += spares * (end - t)
        span = end - t
        step = min(pending, span)  # restart first (start-up, load), then segments
        out.restarting, pending = out.restarting + step, pending - step
        job.advance(span - step)
        t = end
        if t >= m.wall:
            out.lost += job.p  # the tail after the last shared save
            return t, False
        if end < fail:  # a repaired node is back (exponential gaps: redrawing is exact)
            spares, back = spares + 1, back[1:]
            continue
        if m.repair > 0:
            back = sorted([*back, t + draw.repair(m.repair)])
        if draw.is_spare(spares, m.nodes):
            spares, out.spare_failures = spares - 1, out.spare_failures + 1
            continue
        batch = draw.one_of(1, m.nodes)
        out.failures, out.batch_lost = out.failures + 1, out.batch_lost + int(batch)
        local = job.fail(spares == 0 or batch, draw)
        detect = min(m.detect, m.wall - t)
        out.detecting, out.spare_node_s = out.detecting + detect, out.spare_node_s + spares * detect
        t += detect
        if spares == 0 or batch:
            out.requeues += 1
            return t, batch
        spares, out.in_alloc = spares - 1, out.in_alloc + 1
        pending = m.restart_local if local else m.restart_in
    return t, False


def trial(m: SpareModel, draw: Draws) -> Tally:
    """One run of the job over `m.wall` seconds (event by event)."""
    out, t, batch = Tally(m.wall, m.nodes), 0.0, False
    while t < m.wall:
        wait = m.human_wait if batch and not m.successor else draw.queue_wait()
        wait *= m.successor_scale if batch and m.successor else 1.0
        wait = min(wait, m.wall - t)  # nothing held, nothing fails
        out.queued, t = out.queued + wait, t + wait
        if t < m.wall:
            t, batch = _allocation(m, draw, out, t)
    return out


def simulate(
    base: SpareModel, spares: Sequence[int], waits: QueueWait, trials: int, seed: int
) -> list[tuple[Tally, float]]:
    """Mean tally and goodput standard deviation per K (each K replays the same seeds)."""
    out = []
    for k in spares:
        model = SpareModel(**{**{f.name: getattr(base, f.name) for f in fields(base)}, "spares": k})
        runs = [
            trial(model, Draws(random.Random(seed * 100_003 + i), waits)) for i in range(trials)
        ]
        mean = Tally(base.wall, base.nodes)
        for f in fields(Tally)[2:]:
            setattr(mean, f.name, statistics.fmean(getattr(r, f.name) for r in runs))
        out.append((mean, statistics.stdev(r.goodput for r in runs) if trials > 1 else 0.0))
    return out
