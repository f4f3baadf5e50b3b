"""`python -m slurmtrain.batch.setup_failed RUN_DIR --line N --rc RC`: a `cluster.setup` line failed.

The batch script runs the site's setup lines (module load, conda activate, source ...) in its own
shell before the first srun of every attempt. When one exits non-zero, no rank started and none
would: the attempt ends `setup_failed` and the run stops, with the line and its exit code in the
ledger (`status` shows them), instead of a crash loop of restarts that fail the same way.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

from slurmtrain.common import events, slurm_text
from slurmtrain.common.events import FailureClass
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import load_run_config
from slurmtrain.common.schema_cluster import setup_lines

EXIT_SETUP_FAILED = 1  # the job ends FAILED; nothing requeues it


def record(run: RunDir, line: int, rc: int, env: Mapping[str, str]) -> str:
    """Close this start as `setup_failed` and stop the run; returns the error line recorded."""
    lines = setup_lines(load_run_config(str(run.config)).cluster.setup)
    text = lines[line - 1] if 0 < line <= len(lines) else "?"
    error = f"cluster.setup line {line} exited {rc}: {text}"
    restart, relaunch = slurm_text.attempt_counters(env)
    nodes = env.get("SLURM_JOB_NODELIST")
    where = events.Where(
        job_id=env.get("SLURM_JOB_ID", ""),
        attempt=None,
        nodes=slurm_text.expand_hostlist(nodes) if nodes else [],
        restart=restart,
        relaunch=relaunch,
    )
    ended = events.AttemptEnded(cls=FailureClass.setup_failed, exit_code=rc, before_started=True)
    run.record(ended, **where)
    run.record(events.Stopped(cls=FailureClass.setup_failed, error=error), **where)
    return error


def main(argv: Optional[Sequence[str]] = None, env: Optional[Mapping[str, str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmtrain.batch.setup_failed")
    parser.add_argument("run_dir")
    parser.add_argument("--line", type=int, required=True, help="1-based, as cluster.setup lists")
    parser.add_argument("--rc", type=int, required=True, help="the line's exit code")
    args = parser.parse_args(argv)
    error = record(RunDir(Path(args.run_dir).resolve()), args.line, args.rc, env or os.environ)
    print(f"slurmtrain: {error}; the run stops (fix the line, then submit again)", file=sys.stderr)
    return EXIT_SETUP_FAILED


if __name__ == "__main__":
    sys.exit(main())
