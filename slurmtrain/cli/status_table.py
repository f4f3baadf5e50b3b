"""`cli status`'s table: one line per run, the columns that tell runs apart first.

name, run (fingerprint), model, swept (the overrides that tell a sweep's point from its
siblings, keys shortened to their last part when that is unambiguous), state with its cause,
step/max, valid_loss, age (since the run last changed), then attempts, job, nodes, spares,
goodput, checkpoint, and the last error (free length). A column that is `-` on every row is left
out (spares on a run that holds none, a job id before any submission): lines stay readable.
Below the table: each branched run's lineage, its newest failed attempt's verdict (class,
culprit, confidence: batch/culprit.py), and a warning line per tracker its newest start dropped
(training went on without it).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

from slurmtrain.common.events import AttemptVerdict, Rows, Started, Straggler, TrackerFailed
from slurmtrain.common.slurm_text import compress_hostlist

COLUMNS = ["name", "run", "model", "swept", "state", "step", "valid_loss", "age", "attempt"]
COLUMNS += ["job", "nodes", "spares", "goodput", "checkpoint", "last error"]
ALWAYS = {"name", "run", "state", "step", "last error"}  # shown even when all `-`
NODES_WIDTH = 40  # a 64-node run's hostlist is cut here (`status --json` has every node)
SWEPT_WIDTH = 40
TRACKER_ERROR_WIDTH = 160  # the warning line's error; the ledger row and the job's log have more


def age(updated: float, now: Optional[float] = None) -> str:
    """`42s`, `5m`, `3h`, `2d`: how long ago the run last changed."""
    seconds = max(0.0, (time.time() if now is None else now) - updated)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def swept_text(items: Sequence[str]) -> str:
    """`optim.lr=0.003 data.seed=2` -> `lr=0.003 seed=2` (the full key where two end alike)."""
    keys = [i.split("=", 1)[0].lstrip("+~") for i in items]
    short = [k.rsplit(".", 1)[-1] for k in keys]
    unique = len(set(short)) == len(short)
    text = " ".join(
        (s if unique else k) + "=" + i.split("=", 1)[1] if "=" in i else i
        for i, k, s in zip(items, keys, short)
    )
    return text if len(text) <= SWEPT_WIDTH else text[: SWEPT_WIDTH - 3] + "..."


def _error(r: Mapping[str, object]) -> str:
    error = f"{r['class']}: {r['error']}" if r.get("class") else ""
    if r.get("last_rollback"):
        error = f"{error}; " if error else ""
        error += f"{r['rollbacks']} rollback(s), last: {r['last_rollback']}"
    return " ".join(error.split())


def tracker_warnings(events: Rows) -> list[str]:
    """`tensorboard failed at open: NotADirectoryError: ...`: each tracker that failed (first
    failure only: a dropped tracker fails once) in `events` (the run tier and the newest start's)."""
    seen: dict[str, str] = {}
    for e in events:
        if isinstance(e, TrackerFailed) and str(e.tracker) not in seen:
            error = " ".join(str(e.error or "").split())
            if len(error) > TRACKER_ERROR_WIDTH:
                error = error[: TRACKER_ERROR_WIDTH - 3] + "..."
            seen[str(e.tracker)] = f"{e.tracker} failed at {e.phase or '?'}: {error}"
    return list(seen.values())


def _nodes(names: Sequence[str]) -> str:
    try:
        nodes = compress_hostlist(list(names))
    except ValueError:
        nodes = ",".join(names)
    return nodes[: NODES_WIDTH - 3] + "..." if len(nodes) > NODES_WIDTH else nodes


def cells(r: Mapping[str, object], now: Optional[float] = None) -> list[str]:
    """One table row's cells, in COLUMNS' order (the last, the error, is free length)."""
    spare = r.get("spares")
    attempts = str(r["attempts"])
    if r.get("window_after"):
        attempts += f" (window {r['window']}, after {r['window_after']})"
    goodput, valid, most = r.get("goodput"), r.get("valid_loss"), r.get("max_steps")
    return [
        str(r["name"]),
        Path(str(r["run"])).name,
        str(r.get("model") or "-"),
        swept_text(list(r.get("swept") or [])) or "-",  # type: ignore[call-overload]
        str(r["state"]),
        f"{r['step']}/{most}" if most else str(r["step"]),
        "-" if not isinstance(valid, (int, float)) else f"{valid:.4f}",
        age(float(r["updated"]), now) if r.get("updated") else "-",  # type: ignore[arg-type]
        attempts,
        str(r.get("job_id") or "-"),
        _nodes(list(r.get("nodes") or [])) or "-",  # type: ignore[call-overload]
        "-"
        if not isinstance(spare, dict)
        else "idle {idle}, used {used}, lost {lost}".format(**spare),
        f"{goodput:.0%}" if isinstance(goodput, (int, float)) else "-",
        str(r.get("checkpoint") or "-"),
        _error(r),
    ]


def straggler_line(events: Rows) -> Optional[str]:
    """`straggler: node n2 1.5x (rank 3)`: the newest start's latest straggler (observe/stragglers.py),
    `chronic, excluded next attempt` when it was."""
    last = next((e for e in reversed(events) if isinstance(e, Straggler)), None)
    if last is None:
        return None
    line = f"straggler: node {last.node} {last.factor or 0:.2f}x (rank {last.rank})"
    newest = max((e.attempt or 0 for e in events if isinstance(e, Started)), default=0)
    if last.attempt is not None and last.attempt < newest:  # an earlier attempt's: say which
        line += f" in attempt {last.attempt}"
    return (
        line
        + (", chronic" if last.chronic else "")
        + (", excluded next attempt" if last.excluded else "")
    )


def verdict_text(v: AttemptVerdict) -> str:
    """`attempt 2 hang: culprit node n2 (rank 1), confidence high`, or `... crash: no culprit
    (configuration/user), confidence high`: one verdict (batch/culprit.py) in a line."""
    if v.culprit_node:
        rank = f" (rank {v.culprit_rank})" if v.culprit_rank is not None else ""
        who = f"culprit node {v.culprit_node}{rank}"
    elif v.culprit_rank is not None:
        who = f"culprit rank {v.culprit_rank}"
    else:
        who = f"no culprit ({v.no_culprit or 'unknown'})"
    attempt = f"attempt {v.attempt}" if v.attempt is not None else f"job {v.job_id} start-up"
    return f"{attempt} {v.cls}: {who}, confidence {v.confidence or '?'}"


def verdict_line(events: Rows) -> Optional[str]:
    """`verdict: ...` (verdict_text) of the newest failed attempt, None when none has one."""
    last = next((e for e in reversed(events) if isinstance(e, AttemptVerdict)), None)
    return f"verdict: {verdict_text(last)}" if last is not None else None


def notes(events: Rows) -> tuple[list[str], Optional[str], Optional[str]]:
    """The lines below the table that the ledger gives: trackers dropped, the slowest node, the
    newest verdict."""
    return tracker_warnings(events), straggler_line(events), verdict_line(events)


def render(rows: Sequence[Mapping[str, object]]) -> None:
    """A plain text table, one line per run (501 runs in milliseconds; a table library took
    half a second), then each branched run's lineage."""
    now = time.time()
    body = [cells(r, now) for r in rows]
    keep = [i for i, c in enumerate(COLUMNS) if c in ALWAYS or any(b[i] != "-" for b in body)]
    table = [[COLUMNS[i] for i in keep]] + [[b[i] for i in keep] for b in body]
    widths = [max(len(row[i]) for row in table) for i in range(len(keep) - 1)]
    for row in table:
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths))
        print(f"{line}  {row[-1]}".rstrip())
    for r in rows:  # lineage below the table: a parent's path and the changed keys are long
        if r.get("branched_from"):
            print(f"{r['name']}/{Path(str(r['run'])).name}: {r['branched_from']}")
        if r.get("successor"):  # `successor 1234 pending`: the job that takes over if this dies
            print(f"{r['name']}/{Path(str(r['run'])).name}: {r['successor']}")
    for r in rows:
        for key in ("slowest_node", "verdict"):
            if r.get(key):
                print(f"{r['name']}/{Path(str(r['run'])).name}: {r[key]}")
    for r in rows:
        failed = r.get("trackers_failed")
        for line in failed if isinstance(failed, list) else ():
            print(f"{r['name']}/{Path(str(r['run'])).name}: warning: tracker {line} (dropped)")
