"""`python -m slurmtrain.cli status [PATH ...]`: every run under a runs root (or the given run dirs).

One row per run: state, attempts, step, last validation loss (a sweep's points side by side), last
checkpoint, job id, nodes, goodput; a stopped run shows its failure class and last error line (`diverged`,
`checkpoint_unreadable` among them) and a run that rolled back how often; a smoke=true run held by its smoke test says so ("waiting: smoke test", or "blocked: smoke failed"
with the smoke run's last error). Reads only run directories (and squeue for liveness).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Optional, TypedDict

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from slurmtrain.cli.goodput import analyze
from slurmtrain.common import ledger
from slurmtrain.common.events import Rows, integer, number, strings, text
from slurmtrain.common.jsonl import merge_rows, rank_keys, read_jsonl, tail_jsonl
from slurmtrain.common.ledger import real_errors
from slurmtrain.common.liveness import StateUnknown
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.windows import current_stop, window
from slurmtrain.login.branch import lineage_line
from slurmtrain.login.smoke import blocked


class SpareNodes(TypedDict):
    held: int
    idle: int
    used: int
    lost: int


# One run's status row (`--json` prints it; tests read it). "class" is a keyword: functional form.
StatusRow = TypedDict(
    "StatusRow",
    {
        "run": str,
        "name": str,
        "state": str,
        "attempts": int,
        "step": int,
        "valid_loss": Optional[float],
        "checkpoint": Optional[str],
        "job_id": Optional[str],
        "nodes": list[str],
        "class": Optional[str],
        "error": Optional[str],
        "goodput": Optional[float],
        "last_event": Optional[str],
        "rollbacks": int,
        "last_rollback": Optional[str],
        "spares": Optional[SpareNodes],
        "branched_from": Optional[str],
        "window": int,
        "window_after": Optional[str],
        "smoke_run": str,
    },
    total=False,
)


def find_runs(paths: list[Path]) -> list[RunDir]:
    found: list[RunDir] = []
    for path in paths:
        if RunDir(path).config.is_file():
            found.append(RunDir(path.resolve()))
            continue
        found += [RunDir(p.parent.resolve()) for p in sorted(path.glob("*/*/config.yaml"))]
    return found


def _state(run: RunDir, rows: Rows) -> str:
    try:
        return run.state(rows)
    except StateUnknown as err:  # Slurm cannot say whether the job lives: say so, do not guess
        return f"unknown: {err}"


def ledger_view(run: RunDir) -> tuple[Rows, Rows]:
    """(run tier, run tier + the rank rows of the newest start that has any): what status reads.
    O(attempts + nodes) files, one open at a time, never every rank's rows of every attempt."""
    rows = run.run_events()
    key = ledger.newest_key(rows, among=rank_keys(run.path))
    return rows, merge_rows([rows, run.rank_rows(*key)]) if key else rows


def metrics_tail(run: RunDir, max_rows: int = 100_000) -> tuple[int, Optional[float]]:
    """(last step, last validation loss) from the end of metrics.jsonl: a long run's file is
    not read whole (the search for a validation loss gives up after `max_rows` rows)."""
    step: Optional[int] = None
    valid: Optional[float] = None
    for i, m in enumerate(tail_jsonl(run.metrics)):
        if step is None and "step" in m:
            step = integer(m, "step")
        if "valid_loss" in m:
            valid = number(m, "valid_loss") if m["valid_loss"] is not None else None
            break
        if i >= max_rows:
            break
    return (step if step is not None else 0), valid


def summarize(run: RunDir) -> StatusRow:
    """The status row of one run (plain values: also what tests and --json read)."""
    run_rows, events = ledger_view(run)
    step, valid_loss = metrics_tail(run)
    latest = run.latest
    last = events[-1] if events else {}
    row: StatusRow = {
        "run": str(run.path),
        "name": run.path.parent.name,
        "state": _state(run, run_rows),
        "attempts": sum(e["event"] == "started" for e in run_rows),
        "step": step,
        "valid_loss": valid_loss,
        "checkpoint": latest.read_text().strip() if latest.exists() else None,
        "job_id": next(
            (text(e, "job_id") for e in reversed(events) if e["event"] == "submitted"),
            None,
        ),
        "nodes": strings(last, "nodes"),
        "class": None,
        "error": None,
        "goodput": None,
        "last_event": text(last, "event"),
        "rollbacks": 0,
        "last_rollback": None,
    }
    rollbacks = [e for e in events if e["event"] == "rollback"]
    if rollbacks:
        r = rollbacks[-1]
        row["rollbacks"] = len(rollbacks)
        row["last_rollback"] = (
            f"step {r.get('step')} (loss {r.get('loss')}) -> step {r.get('to_step')}, "
            f"{r.get('skipped_samples')} samples skipped"
        )
    row["spares"] = spares(run, events)
    row["branched_from"] = lineage_line(run_rows)  # resume_from: parent, step, changed keys
    windows = [e for e in run_rows if e["event"] == "budget_window"]
    row["window"] = 1 + len(windows)  # budgets count from the user's newest resubmission
    row["window_after"] = text(windows[-1], "after_class") if windows else None
    # an older window's stop and errors are history: the user resubmitted since
    stopped = [e for e in window(events) if e["event"] in ("failed", "stopped")]
    if stopped:
        last = stopped[-1]
        if last["event"] == "failed":  # an all-rank failure: the rank with a cause of its own
            same = [e for e in stopped if e.get("job_id") == last.get("job_id")]
            last = (real_errors([e for e in same if e["event"] == "failed"]) or [last])[-1]
        row["class"] = text(last, "class")
        error = (text(last, "error") or "").strip().splitlines()[-1:]
        row["error"] = error[0] if error else None
    if current_stop(run_rows) is not None:
        row["state"] = "stopped: " + (row["class"] or "?")
    held = blocked(events)  # smoke=true: the big job waits for (or was cancelled by) its smoke
    if held is not None:
        row["state"], row["class"] = held["state"], held["class"]
        row["error"], row["smoke_run"] = held["error"], held["smoke_run"]
    if events:
        try:
            # metrics read whole here: goodput times every step (the ledger is not re-read)
            row["goodput"] = analyze(events, read_jsonl(run.metrics), time.time()).goodput.goodput
        except Exception:  # noqa: BLE001  a damaged ledger must not hide the other runs
            row["goodput"] = None
    return row


def spares(run: RunDir, events: Rows) -> Optional[SpareNodes]:
    """faults.spare_nodes of the run: idle now, used (swapped in for a failed node), lost (left
    out of the step) by the newest job's in-allocation restarts; None when the run holds none."""
    try:
        held = int((yaml.safe_load(run.config.read_text()) or {})["faults"]["spare_nodes"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return None
    if held <= 0:
        return None
    job = next((e.get("job_id") for e in reversed(events) if e["event"] == "started"), None)
    swaps = [
        e for e in events if e["event"] == "restarted_in_allocation" and e.get("job_id") == job
    ]
    used = sum(len(strings(e, "swapped_in")) for e in swaps)
    lost = sum(len(strings(e, "left_out")) for e in swaps)
    idle = (integer(swaps[-1], "spares_left") or 0) if swaps else held
    return {"held": held, "idle": idle, "used": used, "lost": lost}


def render(rows: list[StatusRow]) -> None:
    from rich.console import Console  # start-up speed: rich only for the table
    from rich.table import Table

    table = Table(title="slurmtrain runs")
    for col in (
        "name",
        "run",
        "state",
        "attempt",
        "step",
        "valid_loss",
        "checkpoint",
        "job",
        "nodes",
        "spares",
        "goodput",
        "last error",
    ):
        table.add_column(col, overflow="fold")
    for r in rows:
        spare = r.get("spares")
        gp = f"{r['goodput']:.0%}" if r["goodput"] is not None else "-"
        error = f"{r['class']}: {r['error']}" if r["class"] else ""
        if r.get("last_rollback"):
            error = f"{error}; " if error else ""
            error += f"{r['rollbacks']} rollback(s), last: {r['last_rollback']}"
        table.add_row(
            r["name"],
            Path(r["run"]).name,
            r["state"],
            str(r["attempts"])
            + (
                f" (window {r['window']}, after {r['window_after']})"
                if r.get("window_after")
                else ""
            ),
            str(r["step"]),
            "-" if r.get("valid_loss") is None else f"{r['valid_loss']:.4f}",
            r["checkpoint"] or "-",
            str(r["job_id"] or "-"),
            ",".join(r["nodes"]) or "-",
            "-" if not spare else "idle {idle}, used {used}, lost {lost}".format(**spare),
            gp,
            error,
        )
    console = Console(width=200)
    console.print(table)
    for r in rows:  # lineage below the table: a parent's path and the changed keys are long
        if r.get("branched_from"):
            console.print(
                f"{r['name']}/{Path(r['run']).name}: {r['branched_from']}", soft_wrap=True
            )


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m slurmtrain.cli status", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "paths",
        nargs="*",
        type=Path,
        default=[Path(os.environ.get("SLURMTRAIN_RUNS_ROOT", "runs"))],
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per run")
    args = parser.parse_args(argv)
    rows = [summarize(run) for run in find_runs(args.paths)]
    if args.json:
        for r in rows:
            print(json.dumps(r))
    elif rows:
        render(rows)
    else:
        print(f"status: no runs under {', '.join(map(str, args.paths))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
