#!/usr/bin/env python3
"""Goodput simulator: how often to checkpoint a job of N nodes that fails like Llama 3's fleet,
and how many hot spare nodes to hold.

    python tools/goodput_sim.py --nodes 512 --days 60 [--gpus-per-node 8] [--failures-per-node-day X]
        [--ckpt-cost-s 60] [--restart-cost-s 300] [--intervals 10,30,60,120] [--seed 0] [--trials 200]
    python tools/goodput_sim.py --nodes 512 --days 60 --spares 0,1,2,4 [--interval-min M]
        [--queue-median-min 30 --queue-p90-min 240 | --queue-waits-min 5,30,120,...]
        [--detect-s 60] [--in-alloc-restart-s 120] [--restart-cost-s 300]

Without --spares: for each fixed interval (minutes of compute between blocking saves) and for the
Young/Daly optimum tau = sqrt(2 * save * MTBF) it prints the Monte Carlo mean (exponential failures
of the whole job, rate nodes * per-node rate) next to the analytic expectation
(slurmtrain.planning.ckpt_interval).

With --spares (faults.spare_nodes=K): every allocation holds nodes + K and waits in the queue first
(lognormal wait from its median and p90, or drawn from a list of measured waits). Every node held,
spares too, fails at the fleet's rate. A failed spare is gone; a failed training node costs the work
since the last save plus detection, then, with a healthy spare left, a restart inside the allocation
(`--in-alloc-restart-s`: new srun, start-up, load); without one the allocation ends and the job goes
back through the queue (wait + `--restart-cost-s`, with K fresh spares). Spares come back only with
the next allocation (Slurm cannot add nodes to a running job). Goodput = useful compute / wall time;
per paid GPU-h also charges the spares' GPU hours (useful / (nodes x wall + spare hours)).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Sequence, TypeVar

try:
    from slurmtrain.planning import ckpt_interval
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from slurmtrain.planning import ckpt_interval


Number = TypeVar("Number", int, float)


def _positive(kind: type[Number]) -> Callable[[str], Number]:
    def parse(text: str) -> Number:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
        return value

    return parse


def _minutes(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--intervals {text!r}: give minutes like 10,30,60"
        ) from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(
            f"--intervals {text!r}: give positive minutes like 10,30,60"
        )
    return values


@dataclass(frozen=True)
class SpareModel:
    """One job with K hot spares (seconds and node counts; `rate` in failures per node-second)."""

    nodes: int
    spares: int
    wall: float
    rate: float
    interval: float  # compute between blocking saves
    save: float  # seconds a save blocks training
    detect: float  # failure -> noticed
    restart_in: float  # in-allocation restart: srun on a spare, start-up, load
    restart_out: float  # after a trip through the queue: start-up, load
    repair: float = 0.0  # mean seconds until a lost node is back as a spare; 0: next allocation


@dataclass
class Tally:
    """Where one trial's wall time went; the parts sum to `wall`."""

    wall: float
    nodes: int
    useful: float = 0.0
    saving: float = 0.0
    lost: float = 0.0  # compute (and partial saves) since the last save, thrown away
    detecting: float = 0.0
    restarting: float = 0.0
    queued: float = 0.0
    spare_node_s: float = 0.0  # node-seconds of spares held (their cost)
    failures: int = 0  # training nodes
    spare_failures: int = 0
    in_alloc: int = 0
    requeues: int = 0

    @property
    def goodput(self) -> float:
        return self.useful / self.wall

    @property
    def paid_goodput(self) -> float:
        """Useful node-seconds per node-second paid: the training nodes over the wall, spares too."""
        return self.useful * self.nodes / (self.nodes * self.wall + self.spare_node_s)


class Draws:
    """The random inputs of a trial (a test replaces them with a script)."""

    def __init__(self, rng: random.Random, waits: "QueueWait") -> None:
        self.rng, self.waits = rng, waits

    def gap(self, rate: float) -> float:
        return self.rng.expovariate(rate) if rate > 0 else math.inf

    def is_spare(self, spares: int, nodes: int) -> bool:
        return self.rng.random() < spares / (nodes + spares)

    def queue_wait(self) -> float:
        return self.waits.draw(self.rng)

    def repair(self, mean: float) -> float:
        return self.rng.expovariate(1.0 / mean)


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


def trial(m: SpareModel, draw: Draws) -> Tally:
    """One run of the job over `m.wall` seconds (event by event)."""
    out, t, seg = Tally(m.wall, m.nodes), 0.0, m.interval + m.save
    while t < m.wall:
        wait = min(draw.queue_wait(), m.wall - t)  # nothing held, nothing fails
        out.queued, t = out.queued + wait, t + wait
        back: list[float] = []  # when each node in repair is back as a spare, soonest first
        spares, pending, carry = m.spares, m.restart_out, 0.0
        while t < m.wall:  # one allocation
            fail = t + draw.gap((m.nodes + spares) * m.rate)
            end = min(fail, m.wall, back[0] if back else math.inf)
            out.spare_node_s += spares * (end - t)
            span = end - t
            step = min(pending, span)  # restart first (start-up, load), then segments
            out.restarting, pending, span = out.restarting + step, pending - step, span - step
            done = math.floor((carry + span) / seg)
            out.useful, out.saving = out.useful + done * m.interval, out.saving + done * m.save
            carry, t = carry + span - done * seg, end
            if t >= m.wall:
                out.lost += carry  # the tail after the last save
                return out
            if end < fail:  # a repaired node is back (exponential gaps: redrawing is exact)
                spares, back = spares + 1, back[1:]
                continue
            if m.repair > 0:
                back = sorted([*back, t + draw.repair(m.repair)])
            if draw.is_spare(spares, m.nodes):
                spares, out.spare_failures = spares - 1, out.spare_failures + 1
                continue
            out.failures, out.lost, carry = out.failures + 1, out.lost + carry, 0.0
            detect = min(m.detect, m.wall - t)
            out.detecting, out.spare_node_s = (
                out.detecting + detect,
                out.spare_node_s + spares * detect,
            )
            t += detect
            if spares == 0:
                out.requeues += 1
                break
            spares, out.in_alloc, pending = spares - 1, out.in_alloc + 1, m.restart_in
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


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--spares {text!r}: give counts like 0,1,2,4") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"--spares {text!r}: give counts >= 0 like 0,1,2,4")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=_positive(int), required=True)
    p.add_argument(
        "--days", type=_positive(float), required=True, help="wall-clock length of the job"
    )
    p.add_argument("--gpus-per-node", type=_positive(int), default=8)
    p.add_argument(
        "--failures-per-node-day",
        type=_positive(float),
        default=ckpt_interval.LLAMA3_FAILURES_PER_NODE_DAY,
        help="default: Llama 3, 419 interruptions / (54 days * 2048 nodes)",
    )
    p.add_argument("--ckpt-cost-s", type=_positive(float), default=60.0, help="blocking save time")
    p.add_argument(
        "--restart-cost-s",
        type=_positive(float),
        default=300.0,
        help="requeue + start-up + load after a failure",
    )
    p.add_argument("--intervals", type=_minutes, default=[10.0, 30.0, 60.0, 120.0], help="minutes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trials", type=_positive(int), default=200)
    g = p.add_argument_group("hot spares (--spares)")
    g.add_argument("--spares", type=_ints, default=None, help="K values to compare, e.g. 0,1,2,4")
    g.add_argument(
        "--interval-min", type=_positive(float), default=None, help="default: Young/Daly"
    )
    g.add_argument("--queue-median-min", type=_positive(float), default=30.0)
    g.add_argument("--queue-p90-min", type=_positive(float), default=240.0)
    g.add_argument("--queue-waits-min", type=_minutes, default=None, help="measured waits (list)")
    g.add_argument("--detect-s", type=_positive(float), default=60.0, help="failure -> noticed")
    g.add_argument(
        "--repair-h",
        type=float,
        default=0.0,
        help="mean hours until a lost node rejoins the allocation as a spare "
        "(job expansion, a rebooted node); 0: spares come back only with a new allocation",
    )
    g.add_argument(
        "--in-alloc-restart-s",
        type=_positive(float),
        default=120.0,
        help="srun on a spare + start-up + load",
    )
    args = p.parse_args(argv)
    if args.spares is not None and args.queue_p90_min < args.queue_median_min:
        p.error(f"--queue-p90-min {args.queue_p90_min:g}: must be >= --queue-median-min")
    if args.repair_h < 0:
        p.error(f"--repair-h {args.repair_h:g}: must be >= 0 (0: only with a new allocation)")
    return args


def table(args: argparse.Namespace) -> str:
    mtbf = ckpt_interval.job_mtbf_seconds(args.nodes, args.failures_per_node_day)
    wall = args.days * ckpt_interval.DAY
    yd = ckpt_interval.young_daly_interval(args.ckpt_cost_s, mtbf)
    rows = [(f"{m:g} min", m * 60) for m in args.intervals] + [("young-daly", yd)]
    sims = ckpt_interval.monte_carlo(
        [tau for _, tau in rows],
        args.ckpt_cost_s,
        args.restart_cost_s,
        mtbf,
        wall,
        args.trials,
        args.seed,
    )
    best = ckpt_interval.optimal_interval(args.ckpt_cost_s, args.restart_cost_s, mtbf)
    gpus = args.nodes * args.gpus_per_node
    lines = [
        f"{args.nodes} nodes x {args.gpus_per_node} GPUs = {gpus} GPUs, {args.days:g} days, "
        f"{args.failures_per_node_day:.3e} failures/node-day -> job MTBF {mtbf / 3600:.2f} h "
        f"({wall / mtbf:.1f} failures expected)",
        f"save {args.ckpt_cost_s:g} s, restart {args.restart_cost_s:g} s; Young/Daly tau = sqrt(2*save*MTBF)"
        f" = {yd / 60:.1f} min; exact optimum of the model {best / 60:.1f} min "
        f"(goodput {100 * ckpt_interval.interval_goodput(best, args.ckpt_cost_s, args.restart_cost_s, mtbf):.2f}%)",
        f"Monte Carlo: {args.trials} trials, seed {args.seed}; analytic = expectation of the same model",
        "",
    ]
    head = (
        "interval",
        "min",
        "goodput MC",
        "± sd",
        "analytic",
        "failures",
        "lost h",
        "lost GPU-h",
        "save h",
        "restart h",
    )
    body = []
    for (label, tau), (mc, sd) in zip(rows, sims):
        an = ckpt_interval.analytic(tau, args.ckpt_cost_s, args.restart_cost_s, mtbf, wall)
        body.append(
            (
                label,
                f"{tau / 60:.1f}",
                f"{100 * mc.goodput:.2f}%",
                f"{100 * sd:.2f}",
                f"{100 * an.goodput:.2f}%",
                f"{mc.failures:.1f}",
                f"{mc.lost / 3600:.1f}",
                f"{mc.lost / 3600 * gpus:,.0f}",
                f"{mc.saving / 3600:.1f}",
                f"{mc.restarting / 3600:.1f}",
            )
        )
    w = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(c.ljust(w[0]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r))

    lines += [fmt(head), "-" * (sum(w) + 2 * (len(w) - 1)), *(fmt(r) for r in body)]
    return "\n".join(lines)


def spares_table(args: argparse.Namespace) -> str:
    mtbf = ckpt_interval.job_mtbf_seconds(args.nodes, args.failures_per_node_day)
    tau = (
        args.interval_min * 60
        if args.interval_min
        else ckpt_interval.young_daly_interval(args.ckpt_cost_s, mtbf)
    )
    base = SpareModel(
        args.nodes, 0, args.days * ckpt_interval.DAY, args.failures_per_node_day / ckpt_interval.DAY, tau,
        args.ckpt_cost_s, args.detect_s, args.in_alloc_restart_s, args.restart_cost_s,
        args.repair_h * 3600,
    )  # fmt: skip
    if args.queue_waits_min:
        waits = QueueWait(empirical=tuple(60 * w for w in args.queue_waits_min))
        wait_text = f"queue wait drawn from {len(waits.empirical)} measured waits"
    else:
        waits = QueueWait(60 * args.queue_median_min, 60 * args.queue_p90_min)
        wait_text = f"queue wait lognormal, median {args.queue_median_min:g} min, p90 {args.queue_p90_min:g} min"
    gpn = args.gpus_per_node
    lines = [
        f"{args.nodes} nodes x {gpn} GPUs + K spares, {args.days:g} days, "
        f"{args.failures_per_node_day:.3e} failures/node-day (job MTBF {mtbf / 3600:.2f} h); {wait_text}",
        f"save {args.ckpt_cost_s:g} s every {tau / 60:.1f} min of compute; detect {args.detect_s:g} s; "
        f"restart in allocation {args.in_alloc_restart_s:g} s, after the queue {args.restart_cost_s:g} s",
        f"Monte Carlo: {args.trials} trials, seed {args.seed}; "
        + (
            f"a lost node rejoins as a spare after {args.repair_h:g} h on average"
            if args.repair_h > 0
            else "spares return only with a new allocation"
        ),
        "",
    ]
    head = ("K", "goodput", "± sd", "per paid GPU-h", "in-alloc", "requeues", "queue h",
            "lost h", "restart h", "spare GPU-h", "spares failed")  # fmt: skip
    body = []
    sims = simulate(base, args.spares, waits, args.trials, args.seed)
    for k, (m, sd) in zip(args.spares, sims):
        body.append((
            str(k), f"{100 * m.goodput:.2f}%", f"{100 * sd:.2f}", f"{100 * m.paid_goodput:.2f}%",
            f"{m.in_alloc:.1f}", f"{m.requeues:.1f}", f"{m.queued / 3600:.1f}",
            f"{m.lost / 3600:.1f}", f"{(m.restarting + m.detecting) / 3600:.1f}",
            f"{m.spare_node_s / 3600 * gpn:,.0f}", f"{m.spare_failures:.1f}",
        ))  # fmt: skip
    w = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w[i]) for i, c in enumerate(r))

    best = max(range(len(sims)), key=lambda i: sims[i][0].goodput)
    lines += [fmt(head), "-" * (sum(w) + 2 * (len(w) - 1)), *(fmt(r) for r in body), ""]
    lines.append(
        f"best K = {args.spares[best]}: goodput {100 * sims[best][0].goodput:.2f}%, "
        f"{100 * sims[best][0].paid_goodput:.2f}% per paid GPU-hour"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(spares_table(args) if args.spares is not None else table(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
