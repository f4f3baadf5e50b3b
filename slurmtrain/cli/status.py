"""`slurmtrain status [RUNS ...] [--state S]`: runs under a runs root, a name, a glob.

One row per run, newest first: model, swept values, state with its cause (`stopped: by you
(Ctrl-C)`), step/max, validation loss, age, attempts, job, nodes, goodput, last checkpoint
(cli/status_table.py); a stopped run's class and last error line, rollbacks, the newest failed
attempt's verdict (class, culprit, confidence); a run held by its smoke test says so. Below the
table, one line per sweep (a name's runs): points by state, the best valid_loss and its overrides.
RUNS: run or name directories, bare names under the runs root, globs (cli/status_select.py). Reads
only run directories; asks Slurm once for all jobs (liveness.batch).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence, TypedDict

from slurmtrain.cli import run_arg, status_select
from slurmtrain.cli.status_cache import Cache, Figures
from slurmtrain.cli.status_table import notes, render
from slurmtrain.common import ledger, liveness, read_skips
from slurmtrain.common.events import (
    AttemptEnded,
    Branched,
    BudgetWindow,
    Failed,
    FailureClass,
    RestartedInAllocation,
    Rollback,
    Rows,
    Started,
    Stopped,
    Submitted,
    SuccessorQueued,
)
from slurmtrain.common.jsonl import (
    as_integer,
    as_number,
    merge_rows,
    rank_keys,
    read_jsonl,
    tail_jsonl,
)
from slurmtrain.common.ledger import real_errors
from slurmtrain.common.liveness import StateUnknown
from slurmtrain.common.rundir import STOPPED, RunDir
from slurmtrain.common.windows import current_stop, window


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
        "model": Optional[str],
        "swept": list[str],
        "state": str,
        "attempts": int,
        "step": int,
        "max_steps": Optional[int],
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
        "successor": Optional[str],
        "window": int,
        "window_after": Optional[str],
        "smoke_run": str,
        "trackers_failed": list[str],
        "slowest_node": Optional[str],  # `straggler: node n2 1.50x (rank 3)`
        "verdict": Optional[str],  # `verdict: attempt 2 hang: culprit node n2 (rank 1), ...`
        "updated": float,
    },
    total=False,
)


def find_runs(paths: list[Path], root: Optional[Path] = None) -> list[RunDir]:
    """The run directories STATUS arguments name (status_select.select: a run, a name directory,
    a root, a bare name under `root`, a glob)."""
    found, _ = status_select.select([str(p) for p in paths], root or runs_root())
    return [RunDir(p) for p in found]


def runs_root() -> Path:
    return run_arg.root()


def _state(run: RunDir, rows: Rows) -> str:
    try:
        return run.state(rows)
    except StateUnknown as err:  # Slurm cannot say whether the job lives: say so, do not guess
        return f"unknown: {err}"


def ledger_view(run: RunDir, rows: Optional[Rows] = None) -> tuple[Rows, Rows]:
    """(run tier, run tier + the rank rows of the newest start that has any): what status reads.
    O(attempts + nodes) files, one open at a time, never every rank's rows of every attempt.
    `rows`: the run tier, when the caller has read it."""
    rows = run.run_events() if rows is None else rows
    among = rank_keys(run.path)
    if not among:
        return rows, rows
    key = ledger.newest_key(rows, among=among)
    return rows, merge_rows([rows, run.rank_rows(*key)]) if key else rows


def metrics_tail(run: RunDir, max_rows: int = 100_000) -> tuple[int, Optional[float]]:
    """(last step, last validation loss) from the end of metrics.jsonl: a long run's file is
    not read whole (the search for a validation loss gives up after `max_rows` rows)."""
    step: Optional[int] = None
    valid: Optional[float] = None
    for i, m in enumerate(tail_jsonl(run.metrics)):
        if step is None and "step" in m:
            step = _integer(m["step"])
        if "valid_loss" in m:
            valid = _number(m["valid_loss"])
            break
        if i >= max_rows:
            break
    return (step if step is not None else 0), valid


def summarize(
    run: RunDir, run_rows: Optional[Rows] = None, cache: Optional[Cache] = None
) -> StatusRow:
    """The status row of one run (plain values: also what tests and --json read). `run_rows`:
    its run tier, when the caller has read it; `cache`: the figures of runs that do not run
    (cli/status_cache.py)."""
    run_rows, events = ledger_view(run, run_rows)
    state = _state(run, run_rows)
    step, valid_loss, goodput = _figures(run, events, state, cache)
    last = events[-1] if events else None
    config = config_text(run)
    row: StatusRow = {
        "run": str(run.path),
        "name": run.path.parent.name,
        "model": _found(_MODEL, config),
        "state": state,
        "attempts": sum(isinstance(e, Started) for e in run_rows),
        "step": step,
        "max_steps": _integer(_found(_MAX_STEPS, config)),
        "valid_loss": valid_loss,
        "checkpoint": _latest(run),
        "job_id": next((e.job_id for e in reversed(events) if isinstance(e, Submitted)), None),
        "nodes": list(last.nodes) if last else [],
        "class": None,
        "error": None,
        "goodput": goodput,
        "last_event": last.event if last else None,
        "rollbacks": 0,
        "last_rollback": None,
        "updated": status_select.updated(run.path, run_rows),
    }
    _rollbacks(row, events)
    row["trackers_failed"], row["slowest_node"], row["verdict"] = notes(events)
    row["spares"] = spares(events, config)
    _lineage_and_successor(row, run_rows)
    windows = [e for e in run_rows if isinstance(e, BudgetWindow)]
    row["window"] = 1 + len(windows)  # budgets count from the user's newest resubmission
    row["window_after"] = windows[-1].after_class if windows else None
    _last_stop(row, events)
    _stop_state(row, run_rows)
    if any(isinstance(e, Submitted) and e.smoke_run for e in run_rows):
        from slurmtrain.login.smoke import blocked  # start-up speed: smoke=true runs only

        held = blocked(events)  # the big job waits for (or was cancelled by) its smoke run
        if held is not None:
            row["state"], row["class"] = held["state"], held["class"]
            row["error"], row["smoke_run"] = held["error"], held["smoke_run"]
    return row


def _lineage_and_successor(row: StatusRow, run_rows: Rows) -> None:
    row["branched_from"] = None
    if any(isinstance(e, Branched) for e in run_rows):  # resume_from: parent, step, changed keys
        from slurmtrain.login.branch import lineage_line

        row["branched_from"] = lineage_line(run_rows)
    row["successor"] = None
    if any(isinstance(e, SuccessorQueued) for e in run_rows):  # faults.successor: its pending job
        from slurmtrain.batch.successor import shown

        row["successor"] = shown(run_rows)


def _stop_state(row: StatusRow, run_rows: Rows) -> None:  # the class (no_progress: those seen)
    if current_stop(run_rows) is not None:
        row["state"] = "stopped: " + (row["class"] or "?")
        if row["class"] == FailureClass.no_progress and row["error"]:
            row["state"] += f" ({row['error']})"
    elif row["state"] == STOPPED and not row["class"]:
        row["state"] = stop_cause(run_rows)


def _latest(run: RunDir) -> Optional[str]:
    """The `latest` checkpoint pointer (None: none, or unreadable: another user's run)."""
    try:
        return run.latest.read_text().strip()
    except (OSError, ValueError):
        return None


USER_STOPS = {"ctrl-c": "by you (Ctrl-C)", "cancel": "by you (slurmtrain cancel)"}


def stop_cause(run_rows: Rows) -> str:
    """The state of a stopped run that no failure or budget stopped: how its last attempt ended
    (`stopped: by you (Ctrl-C)`, `stopped: preempted`), else plain `stopped`."""
    ended = next((e for e in reversed(run_rows) if isinstance(e, AttemptEnded)), None)
    if ended is None or not ended.cls:
        return STOPPED
    if ended.cls == FailureClass.cancelled and str(ended.closed_by) in USER_STOPS:
        return f"{STOPPED}: {USER_STOPS[str(ended.closed_by)]}"
    return f"{STOPPED}: {ended.cls}"


def _figures(run: RunDir, events: Rows, state: str, cache: Optional[Cache]) -> Figures:
    """`figures`, from the cache for a run that does not run: goodput counts a queued or
    running run up to now; any other's figures depend on its files alone."""
    live = status_select.state_word(state) in ("running", "unknown")
    key = cache.key(run.path, events) if cache is not None and events and not live else None
    known = cache.get(run.path, key) if cache is not None and key is not None else None
    if known is None:
        known = figures(run, events, time.time() if live else None)
        if cache is not None and key is not None:
            cache.put(run.path, key, known)
    return known


def _rollbacks(row: StatusRow, events: Rows) -> None:
    rollbacks = [e for e in events if isinstance(e, Rollback)]
    if rollbacks:
        r = rollbacks[-1]
        row["rollbacks"] = len(rollbacks)
        loss = f" (loss {r.loss})" if r.loss is not None else ""
        skipped = f", {r.skipped_samples} samples skipped" if r.skipped_samples is not None else ""
        row["last_rollback"] = f"step {r.step}{loss} -> step {r.to_step}{skipped}"


def _last_stop(row: StatusRow, events: Rows) -> None:
    """The class and last error line of the current budget window's last stop or failure (an
    older window's are history: the user resubmitted since)."""
    stopped = [e for e in window(events) if isinstance(e, (Failed, Stopped))]
    if stopped:
        last = stopped[-1]
        if isinstance(last, Failed):  # an all-rank failure: the rank with a cause of its own
            same = [e for e in stopped if isinstance(e, Failed) and e.job_id == last.job_id]
            last = (real_errors(same) or [last])[-1]
        row["class"] = last.cls or None
        error = last.error.strip().splitlines()[-1:]
        row["error"] = error[0] if error else None


def figures(run: RunDir, events: Rows, now: Optional[float]) -> Figures:
    """(last step, last valid_loss, goodput; a live run's up to `now`): a run with a ledger has
    its metrics read whole, once (goodput times every step); one without, only the tail."""
    if not events:
        return (*metrics_tail(run), None)
    from slurmtrain.cli.goodput import analyze  # start-up speed: not for a cached sweep

    metrics = read_jsonl(run.metrics)
    try:  # the ledger is not re-read
        goodput: Optional[float] = analyze(events, metrics, now).goodput.goodput
    except Exception:  # noqa: BLE001  a damaged ledger must not hide the other runs
        goodput = None
    return (*last_metrics(metrics), goodput)


def last_metrics(metrics: Sequence[Mapping[str, object]]) -> tuple[int, Optional[float]]:
    """metrics_tail's (last step, last validation loss) from metrics.jsonl rows already read."""
    step: Optional[int] = None
    for m in reversed(metrics):
        if step is None and "step" in m:
            step = _integer(m["step"])
        if "valid_loss" in m:
            return (step if step is not None else 0), _number(m["valid_loss"])
    return (step if step is not None else 0), None


def _integer(value: object) -> Optional[int]:
    """A metrics value as an integer (None: null, or not a number)."""
    return as_integer(value)


def _number(value: object) -> Optional[float]:
    """A metrics value as a number (None: null; 0.0: not a number, as status always showed)."""
    return None if value is None else as_number(value)


def _key(section: str, key: str) -> re.Pattern[str]:
    """SECTION.KEY's value in config.yaml as the login side writes it (two-space indent): one
    search, not a YAML parse of every run's config."""
    return re.compile(rf"^{section}:[ \t]*\n(?:(?:[ \t].*)?\n)*?  {key}:[ \t]*(\S+)", re.M)


_SPARES, _MODEL, _MAX_STEPS = (
    _key("faults", "spare_nodes"),
    _key("model", "name"),
    _key("train", "max_steps"),
)


def config_text(run: RunDir) -> str:
    """The run's config.yaml, read once per status row ("" when unreadable)."""
    try:
        return run.config.read_text()
    except OSError:
        return ""


def _found(pattern: re.Pattern[str], text: str) -> Optional[str]:
    found = pattern.search(text)
    return found.group(1) if found and found.group(1) not in ("null", "~") else None


def spares(events: Rows, config: str) -> Optional[SpareNodes]:
    """faults.spare_nodes of the run (`config`: its config.yaml): idle now, used (swapped in for
    a failed node), lost (left out of the step) by the newest job's in-allocation restarts; None
    when the run holds none."""
    try:
        held = int(_found(_SPARES, config) or 0)
    except ValueError:
        return None
    if held <= 0:
        return None
    job = next((e.job_id for e in reversed(events) if isinstance(e, Started)), None)
    swaps = [e for e in events if isinstance(e, RestartedInAllocation) and e.job_id == job]
    used = sum(len(e.swapped_in) for e in swaps)
    lost = sum(len(e.left_out) for e in swaps)
    idle = (swaps[-1].spares_left or 0) if swaps else held
    return {"held": held, "idle": idle, "used": used, "lost": lost}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmtrain status",
        description=__doc__.split("\n\n")[0],
        epilog="example: slurmtrain status 'lr_*' --state failed,running\n"
        "         slurmtrain status runs/demo --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="RUNS",
        help="run directories, name directories (runs/NAME), names under the runs root "
        "($SLURMTRAIN_RUNS_ROOT, else ./runs), or globs of them (default: the runs root)",
    )
    parser.add_argument(
        "--state",
        action="append",
        default=[],
        help="only runs in these states (the word before any ':'): running, stopped, finished, "
        "new, unknown, waiting, blocked, or failed (stopped with a failure class); "
        "comma-separated or repeated",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per run")
    parser.add_argument("--runs-root", default=None, help="where run names are looked up")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    words = status_select.wanted(args.state)
    if words - set(status_select.STATE_WORDS):
        unknown = ", ".join(sorted(words - set(status_select.STATE_WORDS)))
        parser.error(f"--state {unknown}: not a state ({', '.join(status_select.STATE_WORDS)})")
    root = run_arg.root(args.runs_root)
    paths, missing = status_select.select(args.paths, root)
    runs = [(RunDir(p), RunDir(p).run_events()) for p in paths]
    cache = Cache()
    with liveness.batch(j for j in (liveness.slurm_owner(rows) for _, rows in runs) if j):
        rows = [summarize(run, run_rows, cache) for run, run_rows in runs]
    cache.save()
    rows.sort(key=lambda r: -r["updated"])  # newest first
    status_select.add_swept(rows)  # type: ignore[arg-type]
    shown = [r for r in rows if status_select.matches(r, words)] if words else rows
    where = ", ".join(args.paths or [str(root)])
    if args.json:
        for r in shown:
            print(json.dumps(r))
        read_skips.warn("status", where)
        return 0
    if shown:
        render(shown)
    if not rows:
        print(f"status: no runs under {where}")
    elif not shown:
        print(f"status: no runs in state {', '.join(sorted(words))} ({len(rows)} under {where})")
    for line in status_select.sweep_lines(rows):  # the whole sweep, whatever --state shows
        print(line)
    for arg in missing if rows else ():
        print(f"status: no runs under {arg}")
    read_skips.warn("status", where)  # one line for every unreadable file or line skipped
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
