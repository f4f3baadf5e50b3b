#!/usr/bin/env python3
"""Goodput simulator: how often to checkpoint a job of N nodes that fails like Llama 3's fleet.

    python tools/goodput_sim.py --nodes 512 --days 60 [--gpus-per-node 8] [--failures-per-node-day X]
        [--ckpt-cost-s 60] [--restart-cost-s 300] [--intervals 10,30,60,120] [--seed 0] [--trials 200]

For each fixed interval (minutes of compute between blocking saves) and for the Young/Daly optimum
tau = sqrt(2 * save * MTBF) it prints the Monte Carlo mean (exponential failures of the whole job,
rate nodes * per-node rate) next to the analytic expectation (slurmtrain.planning.ckpt_interval).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    from slurmtrain.planning import ckpt_interval as ci
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from slurmtrain.planning import ckpt_interval as ci


def _positive(kind: type):
    def parse(text: str):
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
        default=ci.LLAMA3_FAILURES_PER_NODE_DAY,
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
    return p.parse_args(argv)


def table(args: argparse.Namespace) -> str:
    mtbf = ci.job_mtbf_seconds(args.nodes, args.failures_per_node_day)
    wall = args.days * ci.DAY
    yd = ci.young_daly_interval(args.ckpt_cost_s, mtbf)
    rows = [(f"{m:g} min", m * 60) for m in args.intervals] + [("young-daly", yd)]
    sims = ci.monte_carlo(
        [tau for _, tau in rows],
        args.ckpt_cost_s,
        args.restart_cost_s,
        mtbf,
        wall,
        args.trials,
        args.seed,
    )
    best = ci.optimal_interval(args.ckpt_cost_s, args.restart_cost_s, mtbf)
    gpus = args.nodes * args.gpus_per_node
    lines = [
        f"{args.nodes} nodes x {args.gpus_per_node} GPUs = {gpus} GPUs, {args.days:g} days, "
        f"{args.failures_per_node_day:.3e} failures/node-day -> job MTBF {mtbf / 3600:.2f} h "
        f"({wall / mtbf:.1f} failures expected)",
        f"save {args.ckpt_cost_s:g} s, restart {args.restart_cost_s:g} s; Young/Daly tau = sqrt(2*save*MTBF)"
        f" = {yd / 60:.1f} min; exact optimum of the model {best / 60:.1f} min "
        f"(goodput {100 * ci.interval_goodput(best, args.ckpt_cost_s, args.restart_cost_s, mtbf):.2f}%)",
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
        an = ci.analytic(tau, args.ckpt_cost_s, args.restart_cost_s, mtbf, wall)
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
    fmt = lambda r: "  ".join(c.ljust(w[0]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r))  # noqa: E731
    lines += [fmt(head), "-" * (sum(w) + 2 * (len(w) - 1)), *(fmt(r) for r in body)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    print(table(parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
