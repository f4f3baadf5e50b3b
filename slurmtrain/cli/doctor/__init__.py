"""`doctor`: is this machine (and, with --srun, each compute node) ready to run slurmtrain?

Read-only by construction: it runs version/query commands and imports, creates and removes temp
files in the run root and checkpoint dir (the health gate's storage probe, io_checks.py), and never
installs, upgrades or configures anything.

    slurmtrain doctor [--runs-root DIR] [--checkpoint-dir DIR] [--partition P]
                      [--container none|apptainer|pyxis|oci] [--io-write-mb-per-s R]
                      [--image IMAGE] [--planned-checkpoint-gb X] [--srun [--nodes N]] [--json] [--plain]

Exit code 1 when any check fails, else 0. Programmatic use: `run_checks(DoctorOptions(...))`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable, Optional, Sequence

from .results import CONTAINERS, CheckResult, DoctorOptions, default_runs_root
from .runner import NodeReport, check_names, consistency, run_checks, run_on_nodes

__all__ = [
    "CheckResult",
    "DoctorOptions",
    "NodeReport",
    "check_names",
    "run_checks",
    "run_on_nodes",
    "main",
]


def _positive(kind: type[int] | type[float], key: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{key}={text!r} is not a number; pass e.g. {key} 10"
            ) from None
        if value < 0 or (kind is int and value < 1):
            raise argparse.ArgumentTypeError(f"{key}={text!r} must be positive; pass e.g. {key} 10")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slurmtrain doctor",
        description="Check this machine (and compute nodes) for slurmtrain; changes nothing.",
        epilog="example: slurmtrain doctor --container apptainer --image /shared/slurmtrain.sif\n"
        "         slurmtrain doctor --srun --nodes 2 --partition gpu",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--runs-root",
        type=Path,
        default=None,
        help="run directory root (default: $SLURMTRAIN_RUNS_ROOT or ./runs)",
    )
    p.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="checkpoint.dir, when checkpoints live on another filesystem: probed too",
    )
    p.add_argument(
        "--partition", default=None, help="partition to inspect (default: the cluster's default)"
    )
    p.add_argument(
        "--container", choices=CONTAINERS, default="none", help="container runtime the job will use"
    )
    p.add_argument("--image", default=None, help="the container image (cluster.image) to inspect")
    p.add_argument(
        "--planned-checkpoint-gb",
        type=_positive(float, "--planned-checkpoint-gb"),
        default=None,
        help="disk the run's kept checkpoints need, in GB",
    )
    p.add_argument(
        "--srun", action="store_true", help="also run the checks on compute nodes via srun"
    )
    p.add_argument(
        "--nodes", type=_positive(int, "--nodes"), default=1, help="compute nodes for --srun"
    )
    p.add_argument(
        "--srun-timeout",
        type=_positive(float, "--srun-timeout"),
        default=300.0,
        help="seconds to wait for --srun, queueing included",
    )
    _add_check_options(p)
    return p


def _add_check_options(p: argparse.ArgumentParser) -> None:
    """What to run here besides the fixed checks, and how long each may take."""
    p.add_argument(
        "--setup",
        action="append",
        default=[],
        metavar="LINE",
        help="a cluster.setup line to run here as the batch script would (repeat for each)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    p.add_argument("--plain", action="store_true", help="plain text lines instead of a rich table")
    p.add_argument(
        "--timeout",
        type=_positive(float, "--timeout"),
        default=8.0,
        help="seconds per Slurm/container command",
    )
    p.add_argument(
        "--probe-timeout",
        type=_positive(float, "--probe-timeout"),
        default=90.0,
        help="seconds allowed for importing torch and DeepSpeed",
    )
    p.add_argument(
        "--shared-marker", type=Path, default=None, help=argparse.SUPPRESS
    )  # set by --srun
    for way, default in (("write", 1000.0), ("read", 2000.0)):  # faults.io_*'s defaults
        p.add_argument(
            f"--io-{way}-mb-per-s",
            type=_positive(float, f"--io-{way}-mb-per-s"),
            default=default,
            help=f"the plan's per-node {way} rate (faults.io_{way}_mb_per_s); "
            "a probe 10x slower fails (0: not compared)",
        )


def main(argv: Optional[Sequence[str]] = None) -> int:
    from . import report  # rich loads only when printing

    args = build_parser().parse_args(argv)
    options = DoctorOptions(
        runs_root=args.runs_root or default_runs_root(),
        partition=args.partition,
        container=args.container,
        image=args.image,
        planned_checkpoint_gb=args.planned_checkpoint_gb,
        command_timeout=args.timeout,
        probe_timeout=args.probe_timeout,
        shared_marker=args.shared_marker,
        setup=list(args.setup),
        checkpoint_dir=args.checkpoint_dir,
        io_write_mb_per_s=args.io_write_mb_per_s,
        io_read_mb_per_s=args.io_read_mb_per_s,
    )
    checks = run_checks(options)
    nodes: Optional[list[NodeReport]] = None
    extra: list[CheckResult] = []
    if args.srun:
        nodes, extra = run_on_nodes(options, args.nodes, args.srun_timeout)
        if nodes:
            extra.append(consistency(checks, nodes))
    failed = report.any_failed(checks + extra, nodes or ())
    if args.json:
        print(report.to_json(checks + extra, nodes))
    else:
        report.render(checks, "slurmtrain doctor (this machine)", plain=args.plain)
        if args.srun:
            report.render_nodes(nodes or [], extra, plain=args.plain)
        print("FAILED: fix the rows marked fail" if failed else "doctor: no failures")
    return 1 if failed else 0
