"""`slurmtrain logs RUN [--rank R] [--attempt A] [--all] [--errors]`: one merged log.

Every rank writes its own files; reading them one by one hides the question that matters after a crash:
which rank failed first. This merges them (cli/log_merge.py), tags each line `[a{attempt} r{rank}]`,
orders by attempt then by time, and ends with the first error: the earliest Python traceback that is
not an NCCL/watchdog echo of some other rank's failure, then each failed attempt's verdict (class,
culprit, confidence and its evidence: batch/culprit.py). A big run (more than 64 log files) shows its
newest attempt and says how to see the others; one file is open at a time whatever the run's size.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from slurmtrain.cli import run_arg
from slurmtrain.cli.log_merge import (  # noqa: F401  (the names callers and tests import from here)
    BIG_RUN,
    ERROR_LINE,
    LogFile,
    LogLine,
    LogMerger,
    Traceback,
    attempt_windows,
    describe,
    find_logs,
    parse_timestamp,
    scan_logs,
)
from slurmtrain.cli.nccl_dumps import summary
from slurmtrain.cli.status_table import verdict_text
from slurmtrain.common import read_skips
from slurmtrain.common.events import AttemptVerdict
from slurmtrain.common.rundir import RunDir


def _print_first_error(m: LogMerger) -> None:
    """A red rule naming where, then the block unwrapped (copy-pasteable), then a closing rule."""
    from rich.console import Console  # start-up speed: rich only for a first error
    from rich.text import Text

    console = Console(highlight=False)
    if m.note:
        console.print(Text(m.note, style="yellow"), soft_wrap=True)
    tb = m.first_error()
    if tb is not None:
        tag = LogLine(tb.attempt, tb.rank, None, "", tb.path, tb.lineno).tag
        note = "  (an NCCL/watchdog error: no other traceback found)" if tb.nccl else ""
        where, text = f"{tag} {tb.path.name}:{tb.lineno}{note}", tb.text
    elif m.first_error_line is not None:
        ln = m.first_error_line
        where, text = f"{ln.tag} {ln.path.name}:{ln.lineno} (no Python traceback)", ln.text
    else:
        console.print(Text("First error: none found", style="green"))
        return
    console.rule(Text(f"First error {where}", style="bold red"), style="red", align="left")
    console.print(Text(text, style="bold red"), soft_wrap=True)
    console.rule(style="red")


def verdict_lines(run: RunDir, attempt: Optional[int] = None) -> list[str]:
    """`verdict: attempt 2 hang: culprit node n2 (rank 1), confidence high` and its evidence, one
    indented line each, for every failed attempt (only `attempt`'s when given)."""
    lines: list[str] = []
    for v in run.run_events():
        if isinstance(v, AttemptVerdict) and (attempt is None or v.attempt == attempt):
            lines.append(f"verdict: {verdict_text(v)}")
            lines += [f"  evidence: {e}" for e in v.evidence]
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="slurmtrain logs",
        description=__doc__.split("\n\n")[0],
        epilog="example: slurmtrain logs lr_sweep --errors   (a name: its newest run)\n"
        "         slurmtrain logs runs/demo/3f2a9c1e77b0 --attempt 2 --rank 0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", metavar="RUN", help=run_arg.HELP)
    p.add_argument("--rank", type=int, default=None, help="only this global rank's files")
    p.add_argument("--attempt", type=int, default=None, help="only this attempt")
    p.add_argument(
        "--all", action="store_true", help="every attempt (a big run shows its newest by default)"
    )
    p.add_argument("--errors", action="store_true", help="only traceback and error lines")
    p.add_argument("--runs-root", default=None, help="where run names are looked up")
    args = p.parse_args(argv)
    args.run_dir = run_arg.one(args.run, "logs", args.runs_root)
    if args.run_dir is None:
        return 2
    if not RunDir(args.run_dir).logs.is_dir():
        print(
            f"slurmtrain logs: {args.run_dir}: no logs/ directory (not a run directory, or a "
            f"run that has not started)",
            file=sys.stderr,
        )
        return 2
    m = LogMerger(args.run_dir, args.rank, args.attempt, all_attempts=args.all)
    try:
        write = sys.stdout.write
        for line in m:
            if not args.errors or line.in_traceback or ERROR_LINE.search(line.text):
                write(f"{line.tag} {line.text}\n")
        sys.stdout.flush()
        _print_first_error(m)
        for text in summary(RunDir(args.run_dir).logs):  # NCCL's flight recorder, if it dumped
            print(text)
        for text in verdict_lines(RunDir(args.run_dir), args.attempt):
            print(text)
    except BrokenPipeError:  # `| head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    read_skips.warn("logs", args.run_dir)  # one line for every unreadable file or line skipped
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
